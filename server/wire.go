package server

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/proc"
)

// The engine's results in package api's wire types. The everyday types
// the API was built around (a checkpoint, a restore, a log entry) are
// converted field by field below; the engine's reports, which the API
// serves whole (status, gc, diff, lineage, audit, ps, policies, forget,
// receipts), go through wire: their api twins declare the same fields
// with the same JSON names, so the report's JSON decodes into its twin
// unchanged (wire_test.go holds each pair to the same JSON shape).

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

// wire converts v (an engine report, or an api request) into its twin T
// through its JSON, which is what the wire carries either way.
func wire[T any](v any) (T, error) {
	var out T
	data, err := json.Marshal(v)
	if err != nil {
		return out, fmt.Errorf("encoding %T: %w", v, err)
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return out, fmt.Errorf("decoding %T as %T: %w", v, out, err)
	}
	return out, nil
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
		Name: s.Sandbox.Name, Origin: idOf(s.Sandbox.Origin), Root: s.Root}
	if s.Head != nil {
		id, turn := idOf(s.Head.ID), s.Head.Turn
		row.Head, row.Turn = &id, &turn
	}
	return row
}

func checkpointOf(r *engine.CheckpointResult) *api.Checkpoint {
	return &api.Checkpoint{BlobsNew: r.Stats.BlobsNew, BytesNew: r.Stats.BytesNew, BytesRead: r.Stats.BytesRead,
		Class: api.Class(r.Class), DurationMS: ms(r.Duration), Entries: r.Stats.Entries, FilesRead: r.Stats.FilesRead,
		ID: idOf(r.ID), ObjectsNew: r.Stats.ObjectsNew, Parent: idOf(r.Parent), ProcessChange: r.ProcessChange,
		Sandbox: r.Sandbox, Turn: r.Turn}
}

func logEntryOf(cp *delta.Checkpoint, head, onHead bool) api.LogEntry {
	return api.LogEntry{BaseTree: idOf(cp.BaseTree), Branches: []string{}, BytesNew: cp.Stats.BytesNew, Class: api.Class(cp.Class),
		Created: cp.Created, FSTree: idOf(cp.FSTree), Head: head, ID: idOf(cp.ID), Message: cp.Message, OnHead: onHead,
		Parent: idOf(cp.Parent), Sandbox: cp.Sandbox, Turn: cp.Turn, Conv: idPtr(cp.Conv)}
}

func restoreOf(r *engine.RestoreResult) *api.Restore {
	return &api.Restore{Checkpoint: idOf(r.Checkpoint.ID), DurationMS: ms(r.Duration), Processes: r.Processes,
		Root: r.Root, Sandbox: r.Sandbox, Turn: r.Checkpoint.Turn, Receipt: receiptOf(r.Receipt)}
}
