package server

import (
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/engine/lazyrun"
	"github.com/turnsnap/turnsnap/proc"
)

// The engine's results in package api's wire types. The everyday types
// the API was built around (a checkpoint, a restore, a log entry, a
// receipt) are converted by hand below; the engine's reports, which the
// API serves whole (status, gc, diff, ls, lineage, audit, ps, policies,
// forget), go through wire: their api twins declare the same fields with
// the same JSON names (wire_test.go holds each pair to the same JSON
// shape), so wire copies them by name.

// ms is a duration as a duration_ms field carries it.
func ms(d time.Duration) float64 { return api.MS(d) }

// idOf is a content ID as the API spells it ("" for the zero ID).
func idOf(id delta.ID) api.ID {
	if id.IsZero() {
		return ""
	}
	return api.ID(id.String())
}

// idPtr is idOf for an optional ID.
func idPtr(id *delta.ID) *api.ID {
	if id == nil {
		return nil
	}
	v := idOf(*id)
	return &v
}

// wire converts v (an engine report, or an api request) into its twin T,
// field by field by JSON name: each string keeps its bytes (a path that is
// not UTF-8 reaches the CLI's direct mode as it is), and a content ID
// becomes its hex. A field of T that v lacks stays zero; a field whose
// value does not convert is an error (wire_test.go holds each pair to one
// shape, so none is expected).
func wire[T any](v any) (T, error) {
	var out T
	if err := convert(reflect.ValueOf(&out).Elem(), reflect.ValueOf(v)); err != nil {
		return out, fmt.Errorf("converting %T to %T: %w", v, out, err)
	}
	return out, nil
}

var (
	deltaIDType = reflect.TypeFor[delta.ID]()
	apiIDType   = reflect.TypeFor[api.ID]()
)

// convert sets dst to src's value, as encoding/json would carry it across.
func convert(dst, src reflect.Value) error {
	if src.Kind() == reflect.Interface || (src.Kind() == reflect.Pointer && dst.Kind() != reflect.Pointer) {
		if src.IsNil() {
			return nil
		}
		return convert(dst, src.Elem())
	}
	st, dt := src.Type(), dst.Type()
	switch {
	case st.AssignableTo(dt):
		dst.Set(src)
		return nil
	case st == deltaIDType && dt == apiIDType:
		dst.Set(reflect.ValueOf(idOf(src.Interface().(delta.ID))))
		return nil
	case st == apiIDType && dt == deltaIDType:
		id := delta.ID{}
		if err := id.UnmarshalText([]byte(src.String())); err != nil {
			return err
		}
		dst.Set(reflect.ValueOf(id))
		return nil
	}
	switch dt.Kind() {
	case reflect.Pointer:
		if st.Kind() != reflect.Pointer {
			return fmt.Errorf("%v into %v", st, dt)
		}
		if src.IsNil() {
			return nil
		}
		v := reflect.New(dt.Elem())
		if err := convert(v.Elem(), src.Elem()); err != nil {
			return err
		}
		dst.Set(v)
	case reflect.Slice:
		if st.Kind() != reflect.Slice {
			return fmt.Errorf("%v into %v", st, dt)
		}
		if src.IsNil() {
			return nil
		}
		v := reflect.MakeSlice(dt, src.Len(), src.Len())
		for i := range src.Len() {
			if err := convert(v.Index(i), src.Index(i)); err != nil {
				return err
			}
		}
		dst.Set(v)
	case reflect.Map:
		if st.Kind() != reflect.Map {
			return fmt.Errorf("%v into %v", st, dt)
		}
		if src.IsNil() {
			return nil
		}
		v := reflect.MakeMapWithSize(dt, src.Len())
		for it := src.MapRange(); it.Next(); {
			k, e := reflect.New(dt.Key()).Elem(), reflect.New(dt.Elem()).Elem()
			if err := convert(k, it.Key()); err != nil {
				return err
			}
			if err := convert(e, it.Value()); err != nil {
				return err
			}
			v.SetMapIndex(k, e)
		}
		dst.Set(v)
	case reflect.Struct:
		if st.Kind() != reflect.Struct {
			return fmt.Errorf("%v into %v", st, dt)
		}
		from := map[string][]int{}
		for name, index := range jsonFields(st, nil) {
			from[name] = index
		}
		for name, index := range jsonFields(dt, nil) {
			si, ok := from[name]
			if !ok {
				continue
			}
			if err := convert(dst.FieldByIndex(index), src.FieldByIndex(si)); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
	default:
		if !st.ConvertibleTo(dt) || st.Kind() != dt.Kind() {
			return fmt.Errorf("%v into %v", st, dt)
		}
		dst.Set(src.Convert(dt))
	}
	return nil
}

// jsonFields yields the fields of struct t that encoding/json encodes, by
// their JSON names, with their index paths (embedded structs' fields
// promoted).
func jsonFields(t reflect.Type, prefix []int) func(func(string, []int) bool) {
	return func(yield func(string, []int) bool) {
		for i := range t.NumField() {
			f := t.Field(i)
			index := append(append([]int(nil), prefix...), i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" || (!f.IsExported() && !f.Anonymous) {
				continue
			}
			if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
				for n, x := range jsonFields(f.Type, index) {
					if !yield(n, x) {
						return
					}
				}
				continue
			}
			if name == "" {
				name = f.Name
			}
			if !yield(name, index) {
				return
			}
		}
	}
}

// wirePtr is wire for a result the engine returns by pointer (nil stays
// nil).
func wirePtr[T any, E any](v *E, err error) (*T, error) {
	if err != nil || v == nil {
		return nil, err
	}
	out, err := wire[T](v)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// receiptOf is a restore's receipt on the wire.
func receiptOf(r *engine.Receipt) *api.Receipt {
	if r == nil {
		return nil
	}
	f := r.Files
	out := &api.Receipt{Kind: r.Kind, Sandbox: r.Sandbox, Checkpoint: idOf(r.Checkpoint), OK: r.OK,
		Files: api.FilesReceipt{Want: idOf(f.Want), Got: idOf(f.Got), WantState: idOf(f.WantState), GotState: idOf(f.GotState),
			Written: f.Written, Checked: f.Checked, Noise: f.Noise, Mismatch: f.Mismatch, Match: f.Match},
		NotRestored: r.NotRestored, Check: r.Check}
	if p := r.Processes; p != nil {
		out.Processes = &api.ProcessReceipt{Want: inventoryOf(p.Want), Got: inventoryOf(p.Got), Missing: p.Missing,
			Churn: p.Churn, Match: p.Match}
	}
	return out
}

func inventoryOf(inv proc.Inventory) api.Inventory {
	out := api.Inventory{Listening: inv.Listening}
	if inv.Procs != nil {
		out.Procs = make([]api.InventoryProc, len(inv.Procs))
	}
	for i, p := range inv.Procs {
		out.Procs[i] = api.InventoryProc{PID: p.PID, PPID: p.PPID, Comm: p.Comm, Cmdline: p.Cmdline}
	}
	return out
}

func sandboxOf(s engine.SandboxInfo) api.Sandbox {
	row := api.Sandbox{Backend: s.Sandbox.Backend, BaseTree: idOf(s.Sandbox.BaseTree), Created: s.Sandbox.Created,
		Name: string(s.Sandbox.Name), Origin: idOf(s.Sandbox.Origin), Root: s.Root}
	if s.Head != nil {
		id, turn := idOf(s.Head.ID), s.Head.Turn
		row.Head, row.Turn = &id, &turn
	}
	return row
}

// lazyOf is a lazy restore's progress on the wire; nil when none runs.
func lazyOf(st lazyrun.Status) *api.LazyRestore {
	if !st.Running {
		return nil
	}
	out := &api.LazyRestore{Pending: st.Pending, Filled: st.Filled, Bytes: st.Bytes, OnDemand: st.OnDemand, Whole: st.Whole}
	if st.Err != nil {
		out.Error = st.Err.Error()
	}
	return out
}

func checkpointOf(r *engine.CheckpointResult) *api.Checkpoint {
	return &api.Checkpoint{BlobsNew: r.Stats.BlobsNew, BytesNew: r.Stats.BytesNew, BytesRead: r.Stats.BytesRead,
		Class: api.Class(r.Class), DurationMS: ms(r.Duration), Entries: r.Stats.Entries, FilesRead: r.Stats.FilesRead,
		ID: idOf(r.ID), ObjectsNew: r.Stats.ObjectsNew, Parent: idOf(r.Parent), ProcessChange: r.ProcessChange,
		Sandbox: r.Sandbox, Turn: r.Turn, PhasesMS: phasesMS(r.Phases)}
}

// phasesMS is where a turn's time went, in milliseconds, by phase (the
// phases it went through; engine.Phases).
func phasesMS(p engine.Phases) map[string]float64 {
	return msByPhase(map[string]time.Duration{engine.PhaseFreeze: p.Freeze, engine.PhaseScan: p.Scan,
		engine.PhaseDump: p.Dump, engine.PhaseStore: p.Store, engine.PhaseCommit: p.Commit})
}

// msByPhase is phases in milliseconds, without those that took no
// measurable time (a phase the work did not go through takes nanoseconds
// or nothing).
func msByPhase(phases map[string]time.Duration) map[string]float64 {
	out := map[string]float64{}
	for name, d := range phases {
		if v := ms(d); v > 0 {
			out[name] = v
		}
	}
	return out
}

func logEntryOf(cp *delta.Checkpoint, head, onHead bool) api.LogEntry {
	return api.LogEntry{Backend: cp.Backend, BaseTree: idOf(cp.BaseTree), Branches: []string{}, BytesNew: cp.Stats.BytesNew, Class: api.Class(cp.Class),
		Created: cp.Created, FSTree: idOf(cp.FSTree), Head: head, ID: idOf(cp.ID), Message: cp.Message, OnHead: onHead,
		Parent: idOf(cp.Parent), Sandbox: string(cp.Sandbox), Turn: cp.Turn, Conv: idPtr(cp.Conv),
		PauseMS: ms(time.Duration(cp.Stats.PauseNs)), ProcDump: procDumpOf(cp.ProcDump), Processes: cp.ProcTree != nil}
}

func procDumpOf(d *delta.DumpStats) *api.ProcDump {
	if d == nil {
		return nil
	}
	f := func(ns int64) float64 { return ms(time.Duration(ns)) }
	return &api.ProcDump{FreezingMS: f(d.FreezingNs), FrozenMS: f(d.FrozenNs), MemdumpMS: f(d.MemdumpNs),
		MemwriteMS: f(d.MemwriteNs), PagesScanned: d.PagesScanned, PagesWritten: d.PagesWritten}
}

func restoreOf(r *engine.RestoreResult) *api.Restore {
	return &api.Restore{Checkpoint: idOf(r.Checkpoint.ID), DurationMS: ms(r.Duration), Processes: r.Processes,
		Root: r.Root, Sandbox: r.Sandbox, Turn: r.Checkpoint.Turn, Receipt: receiptOf(r.Receipt),
		PhasesMS: branchPhasesMS(r.Phases)}
}

// branchPhasesMS is where a fan-out's time went, in milliseconds, by
// phase (engine.BranchPhases; nil for a restore that is no branch).
func branchPhasesMS(p *engine.BranchPhases) map[string]float64 {
	if p == nil {
		return nil
	}
	return msByPhase(map[string]time.Duration{"prepare": p.Prepare, "image": p.Image, "base": p.Base,
		"layer": p.Layer, "roots": p.Roots, "catalog": p.Catalog, "files": p.Files, "processes": p.Processes})
}
