package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/content"
	"github.com/turnsnap/turnsnap/engine/statememo"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
)

// CheckpointOptions configures Checkpoint.
type CheckpointOptions struct {
	// Turn is the agent turn this checkpoint closes; nil means the parent's
	// turn plus one.
	Turn    *int   `json:"turn,omitempty"`
	Message string `json:"message,omitempty"`
	// RecordSkips writes a record for a turn that changed nothing, class
	// skip, with the head's trees and no new objects, so a framework that
	// wants one log line per turn gets one (docs/FORMAT.md, "Record").
	RecordSkips bool `json:"record_skips,omitempty"`
	// Conv, if set, is the conversation hash of the model call that closes
	// the turn (the LLM proxy's turns); the record keeps it.
	Conv *delta.ID
	// Journal, if set, stores the sandbox's model-call journal tree through
	// the turn's content operation and returns its root (nil: no journal).
	// It runs only for a turn that commits. Without it the record carries
	// its parent's journal forward, as it does an unchanged process image.
	Journal func(ctx context.Context, s delta.BlobSaver) (*delta.ID, error)
	// Urgent, if set, is closed when someone waits for this checkpoint right
	// now (the LLM proxy holds a reply that is ready): while it waits for a
	// slot, it moves to the urgent lane (engine/admission).
	Urgent <-chan struct{} `json:"-"`
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
	// Phases is where Duration went, for metrics (zero for a phase the
	// turn did not reach).
	Phases Phases
	// ProcDump is CRIU's own statistics of the dump this turn took (nil
	// when it took none; the record may still carry its parent's).
	ProcDump *delta.DumpStats
}

// Phases splits a checkpoint's time by phase: Freeze is deciding about the
// processes and pausing them, Scan the filesystem scan(s), Dump the CRIU
// dump, Store storing the image, Commit publishing and the catalog
// transaction.
type Phases struct {
	Freeze, Scan, Dump, Store, Commit time.Duration
}

// Checkpoint closes a turn: scan the writable layer (reading only what
// changed), classify, and commit if anything recovery-relevant changed.
//
// A turn whose state key equals the head's is class skip: nothing is written
// to the store or the catalog, and the head already names the state. The
// state key leaves out directory mtimes and overlay copy-up residue, so a
// temp file created and deleted within the turn is a skip. A turn whose
// state key differs is still a skip when its merged state (base plus
// layer, what the sandbox sees and `diff` compares) equals the head's: a
// copy-up that changed nothing visible (`touch -a`, a chmod to the same
// mode of a base file). So a turn is class fs exactly when its diff is
// not empty.
func (e *Engine) Checkpoint(ctx context.Context, name delta.SandboxName, opts CheckpointOptions) (*CheckpointResult, error) {
	done, err := e.op(ctx, name)
	if err != nil {
		return nil, err
	}
	defer done()
	if opts.Turn != nil && *opts.Turn < 0 {
		return nil, fmt.Errorf("sandbox %s: turn %d: turns are numbered from 0: %w", name, *opts.Turn, errdefs.ErrInvalid)
	}
	slot, err := e.locks.admit.Admit(ctx, string(name), opts.Urgent) // one of the checkpoint slots (engine/admission)
	if err != nil {
		return nil, err
	}
	defer slot.Done()
	start := time.Now()
	st, err := e.loadSandbox(ctx, name)
	if err != nil {
		return nil, err
	}
	if err := e.lazy.Wait(ctx, st.name); err != nil { // never record a placeholder (engine/lazyrun)
		return nil, err
	}
	if err := e.rem.MustOwn(st.sb, st.owner, st.head.ID); err != nil {
		return nil, err
	}
	if err := st.root.Mount(ctx); err != nil {
		return nil, err
	}
	// Background freezes wait while turns are in flight (overlay/frozen).
	defer turnStarted(e.backends)()
	// The turn's pending writes live in op: a failed or skipped turn drops
	// it and deletes the packs it wrote (Op.Discard keeps any that got
	// indexed), so a turn that ran out of space leaves nothing behind.
	op := e.data.repo.Begin()
	defer op.Discard(context.WithoutCancel(ctx))
	e.progressPhase("scan", 0)
	// Processes first: decide whether they changed and pause them, so the
	// scan and any dump below are one instant.
	var ph Phases
	t := time.Now()
	pt, err := e.procs.BeginTurn(ctx, st.container, st.head)
	if err != nil {
		return nil, err
	}
	ph.Freeze = time.Since(t)
	t = time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			pt.Resume()
		}
	}
	defer resume()
	// The scan's trees are also kept in memory, so the merged state can be
	// compared with the head's before anything is committed.
	trees := statememo.NewTrees(e.memo.headTrees.loader(string(name), e.data.repo))
	saver := teeTrees{memo: trees, next: deviceGuard{op}}
	be := e.backends[st.sb.Backend] // nil: a backend without optional parts
	res, ts, err := scanTurn(ctx, be, string(name), st, pt, saver)
	defer func() { ts.Failed() }() // a turn that returns early leaves the tracker unsure
	if err != nil {
		return nil, err
	}
	if rescan, err := e.procs.ConfirmIdle(ctx, st.container, pt, st.head); err != nil {
		return nil, err
	} else if rescan {
		if res, ts, err = scanTurn(ctx, be, string(name), st, pt, saver); err != nil {
			return nil, err
		}
	}
	ph.Scan = time.Since(t)
	e.phase(PhaseScan)
	turn := st.head.Turn + 1
	if opts.Turn != nil {
		turn = *opts.Turn
	}
	stats := delta.Stats{
		Entries: res.Stats.Entries, FilesRead: res.Stats.FilesRead, BytesRead: res.Stats.BytesRead,
	}
	// A process restore's own marks on the root (engine/receipt) are not
	// the agent's: the key accepted right after it counts as the head's.
	fsChanged := res.StateKey != st.head.StateKey && !e.receipts.RestoredAs(string(name), st.head.ID, res.StateKey)
	if fsChanged {
		if fsChanged, err = e.mergedChanged(ctx, string(name), st.head, res.Root, trees); err != nil {
			return nil, err
		}
	}
	if !fsChanged && !pt.Changed {
		// Nothing recovery-relevant changed. The scan is worth keeping as
		// the root's committed one only when it had to read files (racy or
		// touched-but-equal entries), which the next scan would read
		// again; and it is safe only when its trees are the head's, all
		// stored. A skip of a merged-equal state can have other trees (a
		// directory whose mtime alone moved, copy-up residue), which a skip
		// never stores: committed, the next turn would take an unchanged
		// directory's tree from them by ID and name a tree in no pack
		// (TestSkipNeverCommitsUnstoredTrees).
		if res.Stats.FilesRead > 0 && res.Root == st.head.FSTree {
			if err := st.root.Committed(res); err != nil {
				return nil, err
			}
		}
		ts.Skipped(res, st.head.FSTree)
		stats.DurationNs = time.Since(start).Nanoseconds()
		if opts.RecordSkips {
			slot.Free() // a skip record's commit is fsyncs, as below
			return e.recordSkip(ctx, op, st, turn, opts.Message, stats, start)
		}
		return &CheckpointResult{ID: st.head.ID, Sandbox: string(name), Class: delta.ClassSkip, Turn: turn,
			Parent: st.head.ID, Stats: stats, Duration: time.Since(start), Phases: ph}, nil
	}
	// Unchanged processes keep the image they were last dumped with.
	procTree, host, dumped := st.head.ProcTree, st.head.Host, st.head.ProcDump
	var dumpNow *delta.DumpStats
	if pt.Changed {
		procTree, host, dumped = nil, nil, nil
		if pt.Running && pt.Cur.NeedsImage() {
			t = time.Now()
			storeImage, stats, err := e.procs.Dump(ctx, st.container, op)
			if err != nil {
				return nil, err
			}
			ph.Dump = time.Since(t)
			resume() // the cut is taken; storing the image need not freeze anyone
			t = time.Now()
			tree, h, err := storeImage()
			if err != nil {
				return nil, err
			}
			ph.Store = time.Since(t)
			procTree, host, dumped, dumpNow = &tree, h, stats, stats
		}
	}
	resume()
	journal := st.head.Journal
	if opts.Journal != nil {
		if journal, err = opts.Journal(ctx, op); err != nil {
			return nil, err
		}
	}
	cp := &delta.Checkpoint{
		Version: delta.RecordVersion, Sandbox: st.name, SandboxID: st.sb.ID, Parent: st.head.ID, Turn: turn,
		Class: classify(fsChanged, pt.Changed), Backend: st.sb.Backend, BaseTree: st.head.BaseTree,
		FSTree: res.Root, StateKey: res.StateKey, ProcTree: procTree, Host: host, ProcDump: dumped,
		Conv: opts.Conv, Journal: journal, Message: opts.Message, Created: time.Now().UTC(), Stats: stats,
	}
	if pt.Changed {
		cp.ProcChange = delta.ProcChangeReason(pt.Reason)
	}
	cp.Version = delta.VersionFor(cp)
	cp.Stats.DurationNs = time.Since(start).Nanoseconds()
	cp.Stats.PauseNs = pt.Paused.Nanoseconds()
	// The slot bounds the turns that scan, hash and compress at once (CPU);
	// the commit is fsyncs, which need no core: holding the slot through
	// them kept the next turn from starting, and kept concurrent commits
	// from sharing a group transaction (catalog.Group). It still counts as
	// urgent until it returns: background work waits for its commit too.
	slot.Free()
	e.progressPhase("commit", 0)
	e.phase(PhaseCommit)
	t = time.Now()
	if err := e.commit(ctx, op, cp, nil, cp.Roots()); err != nil {
		return nil, err
	}
	ph.Commit = time.Since(t)
	e.memo.headTrees.keep(string(name), trees) // the next turn compares with these
	if pt.Changed && pt.Running {
		// Only now: a baseline taken before the commit could make the next
		// turn skip processes no checkpoint holds.
		e.procs.Settle(ctx, st.container)
	}
	if err := ts.Committed(res); err != nil {
		// The checkpoint is committed; a stale cache only costs a re-read.
		e.log.Warn("scan cache not saved", "sandbox", name, "err", err)
	}
	// Branches of cp share its layer, frozen after this call returns
	// (overlay/frozen): the turn does not wait for it.
	if f, ok := be.(rootfs.Freezer); ok {
		var parent delta.ID
		if st.head != nil {
			parent = st.head.FSTree
		}
		f.FreezeLater(string(name), parent, cp)
	}
	out := &CheckpointResult{ID: cp.ID, Sandbox: string(name), Class: cp.Class, Turn: turn, Parent: cp.Parent,
		Stats: cp.Stats, Duration: time.Since(start), Phases: ph, ProcDump: dumpNow}
	if pt.Changed {
		out.ProcessChange = pt.Reason
	}
	return out, nil
}

// recordSkip commits a skip turn as a record of its own: the head's trees,
// state key, process image and model-call journal (so its roots are
// referenced once more and prune, gc and rebuild count it as any record),
// and no new objects. The journal is carried as a turn without a model
// call carries it: a rollback to the skip, or a turn after it, must find
// the journal its parent had (docs/FORMAT.md, "Skip records"). Its conv
// and proc_change are not: they say what closed or changed the parent's
// turn, not this one's.
func (e *Engine) recordSkip(ctx context.Context, op *content.Op, st *sandboxState, turn int, msg string,
	stats delta.Stats, start time.Time) (*CheckpointResult, error) {
	h := st.head
	cp := &delta.Checkpoint{
		Version: delta.RecordVersion, Sandbox: st.name, SandboxID: st.sb.ID, Parent: h.ID, Turn: turn,
		Class: delta.ClassSkip, Backend: st.sb.Backend, BaseTree: h.BaseTree, FSTree: h.FSTree,
		StateKey: h.StateKey, ProcTree: h.ProcTree, Host: h.Host, ProcDump: h.ProcDump, Journal: h.Journal, Message: msg,
		Created: time.Now().UTC(), Stats: stats,
	}
	cp.Version = delta.VersionFor(cp) // 3 with a journal, 5 with a process image's dump statistics
	e.phase(PhaseCommit)
	if err := e.commit(ctx, op, cp, nil, cp.Roots()); err != nil {
		return nil, err
	}
	return &CheckpointResult{ID: cp.ID, Sandbox: string(cp.Sandbox), Class: delta.ClassSkip, Turn: turn, Parent: h.ID,
		Stats: cp.Stats, Duration: time.Since(start)}, nil
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

// resolveFor is resolve for a command about sandbox name: HEAD and HEAD~N
// are its head and that head's ancestors (catalog.Tx.ResolveRef).
func (e *Engine) resolveFor(ctx context.Context, name delta.SandboxName, ref catalog.CheckpointRef) (*delta.Checkpoint, error) {
	var cp *delta.Checkpoint
	err := e.view(ctx, func(tx *catalog.Tx) error {
		id, err := tx.ResolveRef(name, ref)
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

// Resolve is resolve for callers outside the engine, which parse the
// reference where a user gave it (catalog.ParseCheckpointRef).
func (e *Engine) Resolve(ctx context.Context, ref catalog.CheckpointRef) (*delta.Checkpoint, error) {
	return e.resolveFor(ctx, "", ref)
}

// mergedChanged reports whether the merged state base+tree differs from
// the head's, stopping at the first difference (delta.Changed, the test
// delta.Diff applies). A tree that cannot be read makes it a change, the
// safe answer (a false skip would lose the turn).
func (e *Engine) mergedChanged(ctx context.Context, name string, head *delta.Checkpoint, tree delta.ID, trees delta.BlobLoader) (bool, error) {
	changed, err := delta.Changed(ctx, trees, delta.Layers{head.BaseTree, head.FSTree}, delta.Layers{head.BaseTree, tree})
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		e.log.Warn("merged-state comparison failed; checkpointing", "sandbox", name, "err", err)
		return true, nil
	}
	return changed, nil
}

// teeTrees saves every blob through next and also keeps the trees in memo.
type teeTrees struct {
	memo *statememo.Trees
	next delta.BlobSaver
}

func (t teeTrees) SaveBlob(ctx context.Context, bt delta.BlobType, id delta.ID, data []byte) (bool, error) {
	if bt == delta.BlobTree {
		t.memo.SaveBlob(ctx, bt, id, data)
	}
	return t.next.SaveBlob(ctx, bt, id, data)
}
