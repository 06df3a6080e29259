package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/audit"
	"github.com/turnsnap/turnsnap/engine/diffview"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

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
func (e *Engine) Log(ctx context.Context, name string) ([]LogEntry, error) {
	defer e.shared()()
	var out []LogEntry
	err := e.view(ctx, func(tx *catalog.Tx) error {
		if _, err := tx.Sandbox(name); err != nil {
			return err // names the sandbox
		}
		head, err := tx.GetRef(delta.RefHead, name)
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
		own, err := tx.SandboxCheckpoints(name)
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
	Interrupted *Interrupted `json:"interrupted,omitempty"`
}

// Audit reports the sandbox's head lineage turn by turn (engine/audit).
func (e *Engine) Audit(ctx context.Context, name string) (*audit.Report, error) {
	log, err := e.Log(ctx, name)
	if err != nil {
		return nil, err
	}
	defer e.shared()()
	var chain []*delta.Checkpoint
	for _, l := range log {
		if l.OnHead {
			chain = append(chain, l.Checkpoint)
		}
	}
	slices.Reverse(chain)
	return audit.Build(ctx, name, chain, e.repo)
}

// Diff compares two states of a sandbox: from and to name checkpoints; an
// empty from means the head, an empty to means the live root as it is now
// (hashed, not stored).
func (e *Engine) Diff(ctx context.Context, name, from, to string) (*DiffResult, error) {
	return e.DiffWith(ctx, name, from, to, diffview.Options{})
}

// DiffWith is Diff with options (patches).
func (e *Engine) DiffWith(ctx context.Context, name, from, to string, o diffview.Options) (*DiffResult, error) {
	done, err := e.op(ctx, name)
	if err != nil {
		return nil, err
	}
	defer done()
	st, err := e.viewSandbox(ctx, name) // reads only: finishes nobody's work
	if err != nil {
		return nil, err
	}
	layers := func(ref string) (delta.Layers, string, error) {
		cp := st.head
		if ref != "" {
			if cp, err = e.resolveFor(ctx, name, ref); err != nil {
				return nil, "", err
			}
		}
		return delta.Layers{cp.BaseTree, cp.FSTree}, cp.ID.String(), nil
	}
	a, aName, err := layers(from)
	if err != nil {
		return nil, err
	}
	loader := delta.BlobLoader(e.repo)
	var b delta.Layers
	bName := "working"
	live := ""
	if to != "" {
		if b, bName, err = layers(to); err != nil {
			return nil, err
		}
	} else {
		if err := st.root.Mount(ctx); err != nil {
			return nil, err
		}
		trees := &treeMemo{next: e.repo, trees: map[delta.ID][]byte{}}
		res, err := st.root.Scan(ctx, trees)
		if err != nil {
			return nil, err
		}
		b, loader, live = delta.Layers{st.head.BaseTree, res.Root}, trees, st.root.Path()
	}
	changes, err := delta.Diff(ctx, loader, a, b)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: diff: %w", name, err)
	}
	r := &DiffResult{Sandbox: name, From: aName, To: bName, Changes: changes, Interrupted: st.interrupted}
	if r.Paths, err = diffview.Describe(ctx, loader, a, b, live, changes, o); err != nil {
		return nil, fmt.Errorf("sandbox %s: diff: %w", name, err)
	}
	return r, nil
}

// treeMemo keeps the trees of a live scan in memory so they can be diffed
// without storing anything; everything else comes from next.
type treeMemo struct {
	mu    sync.Mutex
	next  delta.BlobLoader
	trees map[delta.ID][]byte
}

func (m *treeMemo) SaveBlob(_ context.Context, t delta.BlobType, id delta.ID, data []byte) (bool, error) {
	if t == delta.BlobTree {
		m.mu.Lock()
		m.trees[id] = bytes.Clone(data)
		m.mu.Unlock()
	}
	return false, nil
}

func (m *treeMemo) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	m.mu.Lock()
	d, ok := m.trees[id]
	m.mu.Unlock()
	if ok {
		return d, nil
	}
	return m.next.LoadBlob(ctx, t, id)
}
