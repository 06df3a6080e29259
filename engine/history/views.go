// Package history is the views of a home's history: a sandbox's log and
// audit, diffs between its states, the whole home's lineage, tags, and
// what retention decides from (LoadHistory). It reads the catalog and the
// blobs; it writes only tags.
package history

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/audit"
	"github.com/turnsnap/turnsnap/engine/diffview"
	"github.com/turnsnap/turnsnap/engine/procs"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
)

// Deps is what the views need of the engine. The catalog, stores and
// blobs are reached through function values: setup, key changes and
// rebuilds replace them under the engine's exclusive lock, and the views
// read them as they are at each call, under the shared one.
type Deps struct {
	// HomeID is this home's id: a sandbox whose owner names no other home
	// is this home's to prune (LoadHistory).
	HomeID func() string
	// View and Update run fn in a catalog transaction.
	View   func(ctx context.Context, fn func(tx *catalog.Tx) error) error
	Update func(ctx context.Context, fn func(tx *catalog.Tx) error) error
	// Blobs reads trees and file contents.
	Blobs func() delta.BlobLoader
	// PutRef writes a ref object to the store; DeleteLocal deletes an
	// object from the local store (an untag's ref).
	PutRef      func(ctx context.Context, kind delta.RefKind, name string, id delta.ID) error
	DeleteLocal func(ctx context.Context, name string) error
	// Queue queues a tag's change for the remote (a no-op without one).
	Queue RefQueue
	// Shared holds the engine's maintenance lock shared until release.
	Shared func() (release func())
	// Op holds sandbox name's operation lock (and Shared) until done.
	Op func(ctx context.Context, name delta.SandboxName) (done func(), err error)
	// Resolve turns a checkpoint reference into a checkpoint, for a
	// command about sandbox name ("" if none): HEAD is its head.
	Resolve func(ctx context.Context, name delta.SandboxName, ref catalog.CheckpointRef) (*delta.Checkpoint, error)
	// ViewSandbox reads sandbox name for a command that only reads: an
	// interrupted operation is reported, never finished. Called under Op.
	ViewSandbox func(ctx context.Context, name string) (*Sandbox, error)
	// TreeMemo returns a saver that keeps a live scan's trees in memory
	// and a loader that reads them first, then next.
	TreeMemo func(next delta.BlobLoader) TreeStore
}

// RefQueue queues ref objects for the remote (remote.Home).
type RefQueue interface {
	QueueRef(tx *catalog.Tx, sandbox, refObject string, target delta.ID, sandboxObject string) error
	QueueDelete(tx *catalog.Tx, sandbox string, names ...string) error
}

// TreeStore keeps blobs saved to it and loads them back.
type TreeStore interface {
	delta.BlobSaver
	delta.BlobLoader
}

// Sandbox is what a diff needs of a sandbox.
type Sandbox struct {
	Head *delta.Checkpoint
	Root rootfs.Root
	// Interrupted is what an interrupted operation left: nil when nothing.
	Interrupted *procs.Interrupted
}

// Views is the home's history, as Deps reach it. It keeps no state: the
// engine makes one for each call.
type Views struct {
	d Deps
}

// New returns the views over d.
func New(d Deps) *Views { return &Views{d: d} }

// LogEntry is one checkpoint in a sandbox's log.
type LogEntry struct {
	*delta.Checkpoint
	Head bool // the sandbox's current head
	// OnHead is true for the head and its ancestors; false for checkpoints
	// abandoned by a rollback (they stay restorable).
	OnHead bool
	// Branches are the other sandboxes that continue from this checkpoint
	// (branched from it, rolled back to it, or took a child of it).
	Branches []string
}

// Log lists a sandbox's history newest first: the head and its ancestors
// (across the branch point, for a branched sandbox), plus the sandbox's own
// checkpoints that a rollback left off the head's line.
func (v *Views) Log(ctx context.Context, name delta.SandboxName) ([]LogEntry, error) {
	defer v.d.Shared()()
	var out []LogEntry
	err := v.d.View(ctx, func(tx *catalog.Tx) error {
		if _, err := tx.Sandbox(delta.SandboxName(name)); err != nil {
			return err // names the sandbox
		}
		head, err := tx.GetRef(delta.RefHead, string(name))
		if err != nil {
			return fmt.Errorf("sandbox %s: head: %w", name, err)
		}
		// Walk parents by hand: prune removes ancestors (no checkpoint needs
		// them), and the line simply ends at the first one pruned.
		var line []*delta.Checkpoint
		for cur := head; !cur.IsZero(); {
			cp, err := tx.Checkpoint(cur)
			if errors.Is(err, errdefs.ErrNotFound) && len(line) > 0 {
				break
			}
			if err != nil {
				return err
			}
			line = append(line, cp)
			cur = cp.Parent
		}
		seen := map[delta.ID]bool{}
		for _, cp := range line {
			seen[cp.ID] = true
			out = append(out, LogEntry{Checkpoint: cp, Head: cp.ID == head, OnHead: true})
		}
		own, err := tx.SandboxCheckpoints(delta.SandboxName(name))
		if err != nil {
			return err
		}
		for _, cp := range own {
			if !seen[cp.ID] {
				out = append(out, LogEntry{Checkpoint: cp})
			}
		}
		return branchMarks(tx, out)
	})
	slices.SortStableFunc(out, func(a, b LogEntry) int {
		if c := b.Created.Compare(a.Created); c != 0 {
			return c
		}
		return bytes.Compare(a.ID[:], b.ID[:])
	})
	return out, err
}

// DiffResult lists what differs between two states of a sandbox.
type DiffResult struct {
	Sandbox string `json:"sandbox"`
	From    string `json:"from"` // checkpoint id, or "working" for the live root
	To      string `json:"to"`
	// Changes is the raw list; Paths says the same for people and scripts
	// (what each change did, sizes, patches), one entry per change.
	Changes []delta.Change        `json:"-"`
	Paths   []diffview.PathChange `json:"changes"`
	// Interrupted is what an interrupted operation left on the sandbox
	// (a diff reports it and finishes nothing): with a rollback pending,
	// the live root may be partly the rollback's target.
	Interrupted *procs.Interrupted `json:"interrupted,omitempty"`
}

// Audit reports the sandbox's head lineage turn by turn (engine/audit).
func (v *Views) Audit(ctx context.Context, name delta.SandboxName) (*audit.Report, error) {
	log, err := v.Log(ctx, name)
	if err != nil {
		return nil, err
	}
	defer v.d.Shared()()
	var chain []*delta.Checkpoint
	for _, l := range log {
		if l.OnHead {
			chain = append(chain, l.Checkpoint)
		}
	}
	slices.Reverse(chain)
	return audit.Build(ctx, string(name), chain, v.d.Blobs())
}

// Diff compares two states of a sandbox: from and to name checkpoints; a
// zero from means the head, a zero to means the live root as it is now
// (hashed, not stored).
func (v *Views) Diff(ctx context.Context, name delta.SandboxName, from, to catalog.CheckpointRef) (*DiffResult, error) {
	return v.DiffWith(ctx, name, from, to, diffview.Options{})
}

// DiffWith is Diff with options (patches).
func (v *Views) DiffWith(ctx context.Context, name delta.SandboxName, from, to catalog.CheckpointRef, o diffview.Options) (*DiffResult, error) {
	done, err := v.d.Op(ctx, name)
	if err != nil {
		return nil, err
	}
	defer done()
	st, err := v.d.ViewSandbox(ctx, string(name)) // reads only: finishes nobody's work
	if err != nil {
		return nil, err
	}
	layers := func(ref catalog.CheckpointRef) (delta.Layers, string, error) {
		cp := st.Head
		if !ref.IsZero() {
			if cp, err = v.d.Resolve(ctx, name, ref); err != nil {
				return nil, "", err
			}
		}
		return delta.Layers{cp.BaseTree, cp.FSTree}, cp.ID.String(), nil
	}
	a, aName, err := layers(from)
	if err != nil {
		return nil, err
	}
	loader := v.d.Blobs()
	var b delta.Layers
	bName := "working"
	live := ""
	if !to.IsZero() {
		if b, bName, err = layers(to); err != nil {
			return nil, err
		}
	} else {
		if err := st.Root.Mount(ctx); err != nil {
			return nil, err
		}
		trees := v.d.TreeMemo(loader)
		res, err := st.Root.Scan(ctx, trees)
		if err != nil {
			return nil, err
		}
		b, loader, live = delta.Layers{st.Head.BaseTree, res.Root}, trees, st.Root.Path()
	}
	changes, err := delta.Diff(ctx, loader, a, b)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: diff: %w", name, err)
	}
	r := &DiffResult{Sandbox: string(name), From: aName, To: bName, Changes: changes, Interrupted: st.Interrupted}
	if r.Paths, err = diffview.Describe(ctx, loader, a, b, live, changes, o); err != nil {
		return nil, fmt.Errorf("sandbox %s: diff: %w", name, err)
	}
	return r, nil
}
