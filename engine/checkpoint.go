package engine

import (
	"context"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
)

// CheckpointOptions configures Checkpoint.
type CheckpointOptions struct {
	// Turn is the agent turn this checkpoint closes; nil means the parent's
	// turn plus one.
	Turn    *int
	Message string
}

// CheckpointResult reports one turn boundary.
type CheckpointResult struct {
	// ID is the new checkpoint, or for a skip the head that already names
	// this state.
	ID       delta.ID
	Sandbox  string
	Class    delta.Class
	Turn     int
	Parent   delta.ID
	Stats    delta.Stats
	Duration time.Duration
	// ProcessChange says why the turn counted as a process change ("" if
	// it did not): a process appeared, ended, used CPU, did I/O...
	ProcessChange string
}

// Checkpoint closes a turn: scan the writable layer (reading only what
// changed), classify, and commit if anything recovery-relevant changed.
//
// A turn whose state key equals the head's is class skip: nothing is written
// to the store or the catalog, and the head already names the state. The
// state key leaves out directory mtimes and overlay copy-up residue, so a
// temp file created and deleted within the turn is a skip.
func (e *Engine) Checkpoint(ctx context.Context, name string, opts CheckpointOptions) (*CheckpointResult, error) {
	done, err := e.op(ctx, name)
	if err != nil {
		return nil, err
	}
	defer done()
	start := time.Now()
	st, err := e.loadSandbox(ctx, name)
	if err != nil {
		return nil, err
	}
	if err := st.root.Mount(ctx); err != nil {
		return nil, err
	}
	// The turn's pending writes live in op: a failed or skipped turn drops
	// it and deletes the packs it wrote (Op.Discard keeps any that got
	// indexed), so a turn that ran out of space leaves nothing behind.
	op := e.repo.Begin()
	defer op.Discard(context.WithoutCancel(ctx))
	// Processes first: decide whether they changed and pause them, so the
	// scan and any dump below are one instant.
	pt, err := e.beginProcTurn(ctx, name, st.head)
	if err != nil {
		return nil, err
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			pt.resume()
		}
	}
	defer resume()
	res, ts, err := e.scanRoot(ctx, name, st, pt, deviceGuard{op})
	defer func() { ts.failed() }() // a turn that returns early leaves the tracker unsure
	if err != nil {
		return nil, err
	}
	if rescan, err := e.confirmIdle(ctx, name, pt, st.head); err != nil {
		return nil, err
	} else if rescan {
		if res, ts, err = e.scanRoot(ctx, name, st, pt, deviceGuard{op}); err != nil {
			return nil, err
		}
	}
	e.phase(PhaseScan)
	turn := st.head.Turn + 1
	if opts.Turn != nil {
		turn = *opts.Turn
	}
	stats := delta.Stats{
		Entries: res.Stats.Entries, FilesRead: res.Stats.FilesRead, BytesRead: res.Stats.BytesRead,
	}
	fsChanged := res.StateKey != st.head.StateKey
	if !fsChanged && !pt.changed {
		// Nothing recovery-relevant changed. The scan's cache only names
		// chunks the head already references, so keeping it is safe; it is
		// worth writing only when the scan had to read files (racy or
		// touched-but-equal entries), which the next scan would read again.
		if res.Stats.FilesRead > 0 {
			if err := st.root.Committed(res); err != nil {
				return nil, err
			}
		}
		ts.skipped(res, st.head.FSTree)
		stats.DurationNs = time.Since(start).Nanoseconds()
		return &CheckpointResult{ID: st.head.ID, Sandbox: name, Class: delta.ClassSkip, Turn: turn,
			Parent: st.head.ID, Stats: stats, Duration: time.Since(start)}, nil
	}
	// Unchanged processes keep the image they were last dumped with.
	procTree, host := st.head.ProcTree, st.head.Host
	if pt.changed {
		procTree, host = nil, nil
		if pt.running && pt.cur.NeedsImage() {
			storeImage, err := e.dump(ctx, name, op)
			if err != nil {
				return nil, err
			}
			resume() // the cut is taken; storing the image need not freeze anyone
			tree, h, err := storeImage()
			if err != nil {
				return nil, err
			}
			procTree, host = &tree, h
		}
	}
	resume()
	cp := &delta.Checkpoint{
		Version: delta.RecordVersion, Sandbox: name, SandboxID: st.sb.ID, Parent: st.head.ID, Turn: turn,
		Class: classify(fsChanged, pt.changed), Backend: st.sb.Backend, BaseTree: st.head.BaseTree,
		FSTree: res.Root, StateKey: res.StateKey, ProcTree: procTree, Host: host,
		Message: opts.Message, Created: time.Now().UTC(), Stats: stats,
	}
	cp.Stats.DurationNs = time.Since(start).Nanoseconds()
	cp.Stats.PauseNs = pt.paused.Nanoseconds()
	e.phase(PhaseCommit)
	if err := e.commit(ctx, op, cp, nil, cp.Roots()); err != nil {
		return nil, err
	}
	if pt.changed && pt.running {
		// Only now: a baseline taken before the commit could make the next
		// turn skip processes no checkpoint holds.
		e.settle(ctx, name)
	}
	if err := ts.saveCache(st.root, res); err != nil {
		// The checkpoint is committed; a stale cache only costs a re-read.
		e.log.Warn("scan cache not saved", "sandbox", name, "err", err)
	}
	ts.done(res)
	out := &CheckpointResult{ID: cp.ID, Sandbox: name, Class: cp.Class, Turn: turn, Parent: cp.Parent,
		Stats: cp.Stats, Duration: time.Since(start)}
	if pt.changed {
		out.ProcessChange = pt.reason
	}
	return out, nil
}

// classify names a turn by what changed (docs/FORMAT.md, "Record": class).
func classify(fs, procs bool) delta.Class {
	switch {
	case fs && procs:
		return delta.ClassFull
	case procs:
		return delta.ClassProcess
	case fs:
		return delta.ClassFS
	}
	return delta.ClassSkip
}

// resolve turns a user's checkpoint reference (full id, unique prefix, tag)
// into a checkpoint.
func (e *Engine) resolve(ctx context.Context, ref string) (*delta.Checkpoint, error) {
	var cp *delta.Checkpoint
	err := e.view(ctx, func(tx *catalog.Tx) error {
		id, err := tx.ResolveCheckpoint(ref)
		if err != nil {
			return err
		}
		cp, err = tx.Checkpoint(id)
		return err
	})
	if err != nil {
		return nil, err // the catalog names the reference
	}
	return cp, nil
}

// Resolve is resolve for callers outside the engine.
func (e *Engine) Resolve(ctx context.Context, ref string) (*delta.Checkpoint, error) {
	return e.resolve(ctx, ref)
}
