package server

import (
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/engine/audit"
	"github.com/turnsnap/turnsnap/engine/diffview"
	"github.com/turnsnap/turnsnap/engine/history"
	"github.com/turnsnap/turnsnap/engine/paths"
	"github.com/turnsnap/turnsnap/engine/retention"
)

// wirePairs are the engine's reports the API serves whole and their twins
// in package api.
var wirePairs = []struct{ eng, wire any }{
	{engine.StatusReport{}, api.StatusReport{}},
	{retention.GCReport{}, api.GCReport{}},
	{history.DiffResult{}, api.DiffResult{}},
	{paths.LsEntry{}, api.LsEntry{}},
	{paths.RestorePathsResult{}, api.RestorePathsResult{}},
	{history.Lineage{}, api.Lineage{}},
	{audit.Report{}, api.AuditReport{}},
	{engine.ProcessList{}, api.ProcessList{}},
	{retention.PolicyView{}, api.PolicyView{}},
	{retention.PolicyOptions{}, api.PolicyOptions{}},
	{retention.ForgetOptions{}, api.ForgetOptions{}},
	{retention.ForgetReport{}, api.ForgetReport{}},
	{retention.Entry{}, api.RetentionEntry{}},
	{engine.Receipt{}, api.Receipt{}},
	{engine.RemoteConfig{}, api.RemoteConfig{}},
	{engine.CorruptObject{}, api.CorruptObject{}},
	{engine.SkippedObject{}, api.SkippedObject{}},
}

var (
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
	timeType      = reflect.TypeFor[time.Time]()
	apiID         = reflect.TypeFor[api.ID]()
)

// shape describes the JSON a type encodes as: field names and options,
// and the shape of each value. A content ID is "id" on either side (hex
// text, "" for none).
func shape(t reflect.Type, seen map[reflect.Type]bool) string {
	switch {
	case t == timeType:
		return "time"
	case t == apiID || t == reflect.TypeFor[delta.ID]():
		return "id"
	case t.Implements(textMarshaler) && t.Kind() != reflect.Pointer:
		return "text:" + t.String()
	}
	switch t.Kind() {
	case reflect.Pointer:
		return "*" + shape(t.Elem(), seen)
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return "bytes"
		}
		return "[]" + shape(t.Elem(), seen)
	case reflect.Map:
		return "map[" + t.Key().Kind().String() + "]" + shape(t.Elem(), seen)
	case reflect.Struct:
		if seen[t] {
			return "recursive"
		}
		seen[t] = true
		defer delete(seen, t)
		var fields []string
		for f := range fields2(t) {
			fields = append(fields, f.name+","+f.opts+":"+shape(f.typ, seen))
		}
		sort.Strings(fields)
		return "{" + strings.Join(fields, " ") + "}"
	}
	return t.Kind().String()
}

type jsonField struct {
	name, opts string
	typ        reflect.Type
}

// fields2 yields the fields encoding/json encodes of struct t, embedded
// structs' promoted.
func fields2(t reflect.Type) func(func(jsonField) bool) {
	return func(yield func(jsonField) bool) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			if tag == "-" || (!f.IsExported() && !f.Anonymous) {
				continue
			}
			name, opts, _ := strings.Cut(tag, ",")
			if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
				for g := range fields2(f.Type) {
					if !yield(g) {
						return
					}
				}
				continue
			}
			if name == "" {
				name = f.Name
			}
			if !yield(jsonField{name, opts, f.Type}) {
				return
			}
		}
	}
}

// Each api twin encodes as its engine report does: the same fields, names,
// options and value shapes, recursively. A field added to an engine report
// and not to its twin fails here rather than going missing on the wire.
func TestWireTwinsHaveTheEngineShape(t *testing.T) {
	for _, p := range wirePairs {
		e, w := reflect.TypeOf(p.eng), reflect.TypeOf(p.wire)
		if se, sw := shape(e, map[reflect.Type]bool{}), shape(w, map[reflect.Type]bool{}); se != sw {
			t.Errorf("%v and %v differ on the wire:\nengine: %s\napi:    %s", e, w, se, sw)
		}
	}
}

// fill sets every field v reaches to a value other than its zero.
func fill(v reflect.Value, n int) {
	switch {
	case v.Type() == timeType:
		v.Set(reflect.ValueOf(time.Date(2026, 12, 7, 8, 0, n, 1000, time.UTC)))
		return
	case v.Type() == reflect.TypeFor[delta.ID]():
		var id delta.ID
		id[0], id[31] = byte(n+1), 0xab
		v.Set(reflect.ValueOf(id))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(n + 1))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(n + 1))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(n) + 0.5)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), n+1)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		fill(v.Index(0), n+1)
		fill(v.Index(1), n+2)
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, n+1)
		fill(e, n+2)
		v.SetMapIndex(k, e)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), n+i)
			}
		}
	}
}

// A report with every field set goes through wire (and a receipt through
// receiptOf) to the same JSON; so do the requests the other way.
func TestWireKeepsTheJSON(t *testing.T) {
	for _, p := range wirePairs {
		for _, dir := range [][2]reflect.Type{{reflect.TypeOf(p.eng), reflect.TypeOf(p.wire)}, {reflect.TypeOf(p.wire), reflect.TypeOf(p.eng)}} {
			from, to := reflect.New(dir[0]), reflect.New(dir[1])
			fill(from.Elem(), 0)
			if dir[0].Kind() == reflect.Struct && dir[0] == reflect.TypeOf(p.wire) {
				fixIDs(from.Elem())
			}
			if err := convert(to.Elem(), from); err != nil {
				t.Fatalf("%v into %v: %v", dir[0], dir[1], err)
			}
			want, _ := json.Marshal(from.Interface())
			got, _ := json.Marshal(to.Interface())
			if string(got) != string(want) {
				t.Errorf("%v into %v:\n got %s\nwant %s", dir[0], dir[1], got, want)
			}
		}
	}
	var r engine.Receipt
	fill(reflect.ValueOf(&r).Elem(), 0)
	want, _ := json.Marshal(&r)
	got, _ := json.Marshal(receiptOf(&r))
	if string(got) != string(want) {
		t.Errorf("receiptOf:\n got %s\nwant %s", got, want)
	}
	r.Processes, r.Files.Got = nil, delta.ID{}
	want, _ = json.Marshal(&r)
	got, _ = json.Marshal(receiptOf(&r))
	if string(got) != string(want) {
		t.Errorf("receiptOf without processes:\n got %s\nwant %s", got, want)
	}
}

// fixIDs makes every api.ID v reaches a valid hex ID, as the engine's
// side can hold only those.
func fixIDs(v reflect.Value) {
	switch {
	case v.Type() == apiIDType:
		v.SetString(strings.Repeat("0a", 32))
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			fixIDs(v.Elem())
		}
	case reflect.Slice:
		for i := range v.Len() {
			fixIDs(v.Index(i))
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fixIDs(v.Field(i))
			}
		}
	}
}

// A path that is not UTF-8 keeps its bytes through wire: the CLI's direct
// mode prints it quoted, byte for byte.
func TestWireKeepsRawNames(t *testing.T) {
	raw := "/bad\xffname"
	d, err := wirePtr[api.DiffResult](&history.DiffResult{Paths: []diffview.PathChange{{Path: raw}}}, nil)
	if err != nil || d.Paths[0].Path != raw {
		t.Fatalf("diff path %q (%v)", d.Paths[0].Path, err)
	}
	ls, err := wire[[]api.LsEntry]([]paths.LsEntry{{Name: raw[1:]}})
	if err != nil || ls[0].Name != raw[1:] {
		t.Fatalf("ls name %q (%v)", ls[0].Name, err)
	}
	if _, err := wire[retention.ForgetOptions](api.ForgetOptions{Sandbox: "s", Policy: api.RetentionPolicy{KeepLast: 2}}); err != nil {
		t.Fatal(err)
	}
	if _, err := wire[api.LsEntry](retention.GCReport{}); err != nil {
		t.Fatal(err) // no field in common: nothing set, no error
	}
	if _, err := wire[api.ID](3); err == nil {
		t.Fatal("an int converted to an ID")
	}
}
