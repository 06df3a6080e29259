package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/turnsnap/turnsnap/btrfs"
	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	intentpkg "github.com/turnsnap/turnsnap/engine/intent"
	"github.com/turnsnap/turnsnap/engine/receipt"
	"github.com/turnsnap/turnsnap/engine/room"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
)

// RestoreResult reports a rollback or branch.
type RestoreResult struct {
	Sandbox    string
	Checkpoint *delta.Checkpoint
	Root       string
	Processes  bool // the checkpoint's processes run again
	Duration   time.Duration
	// LiveScan says how an overlay rollback found the live state it
	// diffed against: "tracked" (from the change tracker's record),
	// "walk", or why the tracker's record could not be used (the
	// Reason* names of package overlay/track). Empty for other backends
	// and branches.
	LiveScan string
	// Mounted says an overlay rollback wrote its diff through the mounted
	// root, which stayed mounted (every name it touched is absent from
	// the base: rootfs.RestoreInfo.Mounted).
	Mounted bool
	// Receipt proves what the restore made (engine/receipt). A restore whose
	// receipt is not OK returns it with a RestoreIncompleteError.
	Receipt *Receipt
	// Phases says where a branch's fan-out spent its time (fanout_phases.go);
	// nil for rollbacks.
	Phases *BranchPhases
}

// Rollback makes the sandbox's root exactly the state of checkpoint ref and
// moves its head there. Later checkpoints stay in the log; the next
// checkpoint's parent is ref, so history forks like a git branch. The state
// is materialised straight from the checkpoint's tree, with no chain replay.
//
// A checkpoint with processes gets them back too, in a fresh container on
// the restored root (files first, then processes), unless FSOnly. A host
// that cannot restore them (CPU flags, kernel, CRIU), an unreadable process
// image, an image that does not fit the files, and a device node the files
// may not hold are all refused before the sandbox is touched: its running
// processes are stopped only once everything that can be checked
// beforehand has been.
func (e *Engine) Rollback(ctx context.Context, name delta.SandboxName, ref catalog.CheckpointRef, o RollbackOptions) (*RestoreResult, error) {
	done, err := e.op(ctx, name)
	if err != nil {
		return nil, err
	}
	defer done()
	start := time.Now()
	cp, err := e.resolveFor(ctx, name, ref)
	if err != nil {
		return nil, err
	}
	if !o.FSOnly {
		if err := e.procs.CheckHost(ctx, cp); err != nil {
			return nil, err
		}
	}
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
	if cp.BaseTree != st.head.BaseTree {
		return nil, fmt.Errorf("sandbox %s: checkpoint %s was taken on another base (%s, sandbox has %s); use `turnsnap branch` instead: %w",
			name, cp.ID.Short(), cp.BaseTree.Short(), st.head.BaseTree.Short(), errdefs.ErrPrecondition)
	}
	// The restore plans its diff through the same loader: the target is
	// checked (and its trees read) once.
	checked := fstree.NewCheckedLoader(e.memo.checked.Loader(e.data.repo))
	fp, err := e.memo.checked.CheckState(ctx, checked, cp.FSTree)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: tree %s: %w", cp.ID.Short(), cp.FSTree.Short(), err)
	}
	if rootsInHome(st.sb.Backend) {
		// The new layer is built in the home beside the live one, and the
		// catalog must still be writable once it is.
		if err := room.Check(string(e.home), e.cat, fp.Bytes, 0); err != nil {
			return nil, fmt.Errorf("sandbox %s: rollback to %s: %w", name, cp.ID.Short(), err)
		}
	}
	// The base is shared by every sandbox on it: a damaged one is refused,
	// not restored onto.
	if _, err := e.checkBase(ctx, string(name), st.sb.Backend, cp.BaseTree, false); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	// Everything that can fail is checked before the running processes are
	// stopped: every rule a restore applies (device nodes included), room
	// for the new layer, the base, and the process image, read and verified
	// into a work directory.
	img, cleanImg, err := e.readyImage(ctx, cp, o.FSOnly)
	if err != nil {
		return nil, err
	}
	defer cleanImg()
	e.phase("rollback: checked") // the target, the base and the image
	// Prepared before the processes stop: their mappings (rootfs.Rollbacker).
	var rb rootfs.Rollback = plainRollback{e: e, name: string(name), root: st.root}
	if r, ok := e.backends[st.sb.Backend].(rootfs.Rollbacker); ok {
		rb = r.BeginRollback(ctx, string(name), st.root, func(ctx context.Context) ([]string, error) {
			running, err := e.procs.Running(ctx, st.container)
			if err != nil || !running {
				return nil, err
			}
			ps, err := e.procs.Snapshot(ctx, st.container)
			if err != nil {
				return nil, err
			}
			return sharedWritable(ps), nil
		})
	}
	if err := e.procs.Stop(ctx, st.container); err != nil {
		rb.Abort()
		return nil, err
	}
	// Root and head change in two steps; the intent makes them one for
	// anyone who finds it (engine/intent). It is written while the restore
	// reads (the live state, the plan), and is durable before the root's
	// first write: a crash before that write needs no intent. From that
	// write on the rollback ends at cp (now, or when the next command
	// finishes it), so the head's ref object is written beside the
	// rewrite; the catalog's head moves once both are durable.
	withProcs := cp.ProcTree != nil && !o.FSOnly
	if lost := st.interrupted; lost != nil && lost.ProcessesLost != "" {
		e.log.Warn("the sandbox's processes had not been restored; this rollback replaces them", "sandbox", name, "why", lost.ProcessesLost)
	}
	intents := e.intents()
	intent := startWrite(func() error {
		return intents.Write(st.sb, intentpkg.Rollback{Target: cp.ID, Processes: withProcs})
	})
	var head *asyncWrite
	beforeWrite := func() error {
		if err := intent.wait(); err != nil {
			return err
		}
		e.phase("rollback: intent written")
		head = startWrite(func() error { return e.putHead(ctx, st.sb, cp.ID) })
		return nil
	}
	e.progressPhase("restore", int64(fp.Bytes))
	info, err := rb.Restore(rootfs.WithPhase(ctx, e.phase), cp, checked, beforeWrite)
	if werr := intent.wait(); err == nil && werr != nil {
		err = werr // a restore that wrote nothing (the root was the target)
	}
	if err != nil {
		if errors.Is(err, fstree.ErrPartial) {
			// The root was partly rewritten: the intent stays, and the
			// next command that loads the sandbox finishes the rollback.
			head.wait()
			return nil, fmt.Errorf("sandbox %s: rollback to %s stopped partway (the next command finishes it): %w", name, cp.ID.Short(), err)
		}
		// The live root is as it was (Root.Restore): nothing to finish,
		// and the head's ref object names the head again.
		if head != nil && head.wait() == nil {
			if perr := e.putHead(ctx, st.sb, st.head.ID); perr != nil {
				err = errors.Join(err, perr)
			}
		}
		intents.Clear(st.sb)
		return nil, err
	}
	e.phase("rollback: root switched")
	if err := e.moveHeadAfter(ctx, string(name), st.sb, cp.ID, head); err != nil {
		return nil, err // the intent stays: the next load finishes the move
	}
	e.phase("rollback: head moved")
	intents.ClearProcsLost(st.sb) // what ran before is replaced now
	res := &RestoreResult{Sandbox: string(name), Checkpoint: cp, Root: st.root.Path(), LiveScan: info.Live, Mounted: info.Mounted}
	// The files are checked, the processes restored and checked: the
	// receipt (engine/receipt). The intent stays until the processes run: a
	// rollback killed while it restores them is finished by the next
	// command, processes included.
	if res.Receipt, res.Processes, err = e.receipts.Check(ctx, "rollback", string(name), st.root, cp, receipt.WrittenHow(st.root, info, false), receipt.RestoredTree(st.root, info), img, withProcs); err != nil {
		intents.NoteProcsLost(st.sb, fmt.Sprintf("the rollback to %s restored the files; its processes: %v", cp.ID.Short(), err))
		intents.Clear(st.sb)
		return nil, fmt.Errorf("files restored, processes not: %w", err)
	}
	if res.Processes {
		e.phase("rollback: processes restored")
	}
	if err := intents.Clear(st.sb); err != nil {
		return nil, err
	}
	res.Duration = time.Since(start)
	if !res.Receipt.OK {
		return res, e.receipts.Fail(ctx, res.Receipt)
	}
	return res, nil
}

// RollbackOptions configures Rollback.
type RollbackOptions struct {
	// FSOnly restores the checkpoint's files and leaves its processes out.
	FSOnly bool
}

// BranchOptions configures Branch.
type BranchOptions struct {
	// Backend of the new sandbox. Empty: the backend and settings of the
	// sandbox the checkpoint was taken in, or the checkpoint's backend
	// without settings if that sandbox is gone. Any backend restores any
	// checkpoint, so a branch may change backend.
	Backend string
	Btrfs   btrfs.Options // the btrfs backend's settings (its Pool)
	// FSOnly restores the checkpoint's files and leaves its processes out.
	FSOnly bool
	// Materialise copies the checkpoint's layer from the store even when
	// this host keeps it frozen (by default an overlay branch stacks on
	// the frozen layer and copies nothing: overlay/frozen).
	Materialise bool
}

// Branch creates sandbox newName whose root equals checkpoint ref. Its head
// is ref itself, so its first checkpoint records ref as parent: lineage
// crosses sandboxes the way git commits cross branches. It is BranchMany
// of one name, so one branch and a fan-out follow the same rules.
func (e *Engine) Branch(ctx context.Context, ref catalog.CheckpointRef, newName delta.SandboxName, o BranchOptions) (*RestoreResult, error) {
	rs, err := e.BranchMany(ctx, ref, []delta.SandboxName{newName}, o)
	if len(rs) == 0 {
		return nil, err
	}
	return rs[0], err
}

// readyImage reads and verifies cp's process image into a work directory
// and checks that it fits cp's files, so a restore can refuse before it
// stops anything. Without processes to restore (none recorded, or fsOnly)
// it returns "" and a no-op cleanup.
func (e *Engine) readyImage(ctx context.Context, cp *delta.Checkpoint, fsOnly bool) (string, func(), error) {
	if cp.ProcTree == nil || fsOnly {
		return "", func() {}, nil
	}
	img, clean, err := e.procs.Image(ctx, cp)
	if err != nil {
		return "", nil, err
	}
	if err := checkImageFiles(ctx, e.data.repo, cp, img); err != nil {
		clean()
		return "", nil, err
	}
	return img, clean, nil
}
