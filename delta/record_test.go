package delta

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// testRecord returns a valid record; turn and created vary it.
func testRecord(sandbox string, parent ID, turn int, created time.Time) *Checkpoint {
	return &Checkpoint{
		Version:  RecordVersion,
		Sandbox:  SandboxName(sandbox),
		Parent:   parent,
		Turn:     turn,
		Class:    ClassFS,
		Backend:  "overlay",
		BaseTree: Hash([]byte("base " + sandbox)),
		FSTree:   Hash([]byte{byte(turn), byte(turn >> 8), byte(turn >> 16)}),
		StateKey: Hash([]byte("state")),
		Message:  "turn <&> message",
		Created:  created,
		Stats:    Stats{Entries: 10, FilesRead: 2, BytesRead: 300, BlobsNew: 1, BytesNew: 90, ObjectsNew: 2, DurationNs: 12345},
	}
}

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)

func TestRecordRoundTrip(t *testing.T) {
	cp := testRecord("agent-1", Hash([]byte("parent")), 3, t0)
	data, id, err := EncodeRecord(cp)
	if err != nil {
		t.Fatal(err)
	}
	if id != Hash(data) {
		t.Fatalf("id %s is not the hash of the bytes", id)
	}
	if bytes.Contains(data, []byte(id.String())) {
		t.Fatalf("record contains its own id: %s", data)
	}
	got, err := DecodeRecord(id, data)
	if err != nil {
		t.Fatal(err)
	}
	want := *cp
	want.ID = id
	if !got.Created.Equal(want.Created) || got.Created.Location() != time.UTC {
		t.Fatalf("created %v, want %v in UTC", got.Created, want.Created)
	}
	// A decoded record re-encodes to the very same bytes.
	again, id2, err := EncodeRecord(got)
	if err != nil || id2 != id || !bytes.Equal(again, data) {
		t.Fatalf("re-encode: id %s err %v, bytes equal %v", id2, err, bytes.Equal(again, data))
	}
	got.Created, want.Created = time.Time{}, time.Time{}
	if !reflect.DeepEqual(*got, want) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, want)
	}
}

func TestRecordDeterministic(t *testing.T) {
	a := testRecord("s", ID{}, 0, t0)
	_, idA, err := EncodeRecord(a)
	if err != nil {
		t.Fatal(err)
	}
	// Same instant in another zone and with a monotonic reading: same ID.
	b := testRecord("s", ID{}, 0, t0.In(time.FixedZone("X", 5*3600)))
	_, idB, _ := EncodeRecord(b)
	now := time.Now()
	c1, c2 := testRecord("s", ID{}, 0, now), testRecord("s", ID{}, 0, now.Round(0))
	_, idC1, _ := EncodeRecord(c1)
	_, idC2, _ := EncodeRecord(c2)
	if idA != idB || idC1 != idC2 {
		t.Fatalf("encoding depends on zone or monotonic clock: %s %s / %s %s", idA, idB, idC1, idC2)
	}
	// The ID field is not part of the record.
	a.ID = Hash([]byte("x"))
	if _, id, _ := EncodeRecord(a); id != idA {
		t.Fatalf("cp.ID changed the encoding")
	}
	// Changing anything else changes it.
	a.Stats.DurationNs++
	if _, id, _ := EncodeRecord(a); id == idA {
		t.Fatalf("stats not covered by the hash")
	}
}

func TestEncodeRecordValidates(t *testing.T) {
	for name, mut := range map[string]func(*Checkpoint){
		"version":   func(cp *Checkpoint) { cp.Version = 0 },
		"future":    func(cp *Checkpoint) { cp.Version = MaxRecordVersion + 1 },
		"sandbox":   func(cp *Checkpoint) { cp.Sandbox = "-x" },
		"class":     func(cp *Checkpoint) { cp.Class = "partial" },
		"fs tree":   func(cp *Checkpoint) { cp.FSTree = ID{} },
		"base tree": func(cp *Checkpoint) { cp.BaseTree = ID{} },
		"created":   func(cp *Checkpoint) { cp.Created = time.Time{} },
	} {
		cp := testRecord("s", ID{}, 1, t0)
		mut(cp)
		if _, _, err := EncodeRecord(cp); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", name, err)
		}
	}
}

func TestDecodeRecordCorrupt(t *testing.T) {
	data, id, err := EncodeRecord(testRecord("s", ID{}, 1, t0))
	if err != nil {
		t.Fatal(err)
	}
	tampered := bytes.Replace(data, []byte(`"turn":1`), []byte(`"turn":2`), 1)
	_, err = DecodeRecord(id, tampered)
	if !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), id.String()) {
		t.Fatalf("tampered: err %v, want ErrCorrupt naming %s", err, id)
	}
	// Bytes that hash correctly but are not an acceptable record.
	decodeEachEdit(t, data, map[string]func(map[string]any){
		"unknown field": func(m map[string]any) { m["extra"] = 1 },
		"version":       func(m map[string]any) { m["version"] = MaxRecordVersion + 1 },
		"version 0":     func(m map[string]any) { m["version"] = 0 },
		"v1 with id":    func(m map[string]any) { m["version"] = 1; m["sandbox_id"] = strings.Repeat("a", 32) },
		"bad id":        func(m map[string]any) { m["sandbox_id"] = "ABC" },
		"class":         func(m map[string]any) { m["class"] = "bogus" },
	})
}

func TestValidName(t *testing.T) {
	for name, want := range map[string]bool{
		"a": true, "agent-1": true, "A.b_c-9": true, "0": true, strings.Repeat("x", 64): true,
		"": false, ".hidden": false, "-flag": false, "a/b": false, "a b": false, "é": false,
		strings.Repeat("x", 65): false, "a\x00": false, "..": false,
	} {
		if got := ValidRefName(name); got != want {
			t.Errorf("ValidRefName(%q) = %v, want %v", name, got, want)
		}
	}
}

// plainRecord is a version 2 record whose bytes do not name field: a record
// without a later version's field keeps its earlier bytes.
func plainRecord(t *testing.T, field string) *Checkpoint {
	t.Helper()
	cp := testRecord("agent", Hash([]byte("parent")), 3, t0)
	plain, _, err := EncodeRecord(cp)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(plain, []byte(field)) {
		t.Fatalf("a record without %s names the field: %s", field, plain)
	}
	return cp
}

// decodeEachEdit applies each edit to a copy of record data's JSON object
// and wants every result refused as ErrCorrupt.
func decodeEachEdit(t *testing.T, data []byte, edits map[string]func(map[string]any)) {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for name, edit := range edits {
		c := maps.Clone(m)
		edit(c)
		b, _ := json.Marshal(c)
		if _, err := DecodeRecord(Hash(b), b); !errors.Is(err, errdefs.ErrCorrupt) {
			t.Errorf("%s: err %v, want ErrCorrupt", name, err)
		}
	}
}
