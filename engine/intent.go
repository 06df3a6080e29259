package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/procs"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"github.com/turnsnap/turnsnap/internal/rootfs"
)

// A rollback changes two things that cannot change in one step: the root
// (one rename inside the backend) and the head (a ref object, then the
// catalog). Before the first, it writes an intent naming the checkpoint;
// after the last, it removes it. Whoever loads the sandbox next to change
// it finds the intent and finishes the rollback (the restore is
// idempotent), so a killed rollback never leaves root and head disagreeing
// for longer than until the next command that writes to the sandbox.
// Commands that only read (ps, diff, a read-only home) report the intent
// and finish nothing; `sandbox rm` and `rollback --abandon` discard it.
//
//	HOME/intents/KEY.rollback    one sandbox's interrupted rollback (KEY:
//	                             delta.Sandbox.Key, so it dies with that
//	                             sandbox and never reaches a later one of
//	                             the same name). Lines: the checkpoint's hex
//	                             ID; "sandbox NAME"; "processes" when the
//	                             rollback also restores the checkpoint's
//	                             processes (they were stopped already).
//	HOME/intents/rollback-NAME   the older form, keyed by name (one line,
//	                             the ID): honoured only for a sandbox that
//	                             existed when it was written.
//	HOME/intents/KEY.procs-lost  processes a finished rollback could not
//	                             restore: one line, why. ps, status, exec and
//	                             the next rollback report it; the sandbox's
//	                             next container start or rollback clears it.

func (h home) intentsDir() string { return filepath.Join(string(h), "intents") }

func (h home) intentFile(sb *delta.Sandbox) string {
	return filepath.Join(h.intentsDir(), sb.Key()+".rollback")
}

// legacyIntentFile is where turnsnap before issue 24 kept the intent.
func (h home) legacyIntentFile(name string) string {
	return filepath.Join(h.intentsDir(), "rollback-"+name)
}

func (h home) procsLostFile(sb *delta.Sandbox) string {
	return filepath.Join(h.intentsDir(), sb.Key()+".procs-lost")
}

// rollbackIntent is an interrupted rollback as its intent file says.
type rollbackIntent struct {
	Target delta.ID
	// Processes: the rollback was to restore Target's processes too.
	Processes bool
}

// Interrupted says what an interrupted operation left on a sandbox, for
// commands that report it rather than finish it (ps, diff, status). It is
// declared with the process listing that reports it (procs.ProcessList).
type Interrupted = procs.Interrupted

func (e *Engine) writeIntent(sb *delta.Sandbox, in rollbackIntent) error {
	p := e.home.intentFile(sb)
	if err := ensureDir(filepath.Dir(p)); err != nil {
		return err
	}
	body := in.Target.String() + "\nsandbox " + sb.Name + "\n"
	if in.Processes {
		body += "processes\n"
	}
	if err := writeDurable(p, body); err != nil {
		return fmt.Errorf("sandbox %s: rollback intent: %w", sb.Name, err)
	}
	return nil
}

// writeDurable replaces file p with body: synced, renamed, directory synced.
func writeDurable(p, body string) error {
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(body)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err == nil {
		err = fsat.SyncDir(filepath.Dir(p))
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// A durable write a rollback starts beside its other steps, whose fsyncs
// would otherwise wait alone: the intent beside the live scan and the plan
// (it must be durable before the root's first write), the head's ref
// object beside the root's rewrite (the catalog's head moves after both).
// wait returns its result once it is durable; every one started is waited
// for before the rollback returns.
type asyncWrite struct {
	done chan struct{}
	err  error
}

func startWrite(f func() error) *asyncWrite {
	w := &asyncWrite{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.err = f()
	}()
	return w
}

// wait is nil-safe: a write never started has nothing to wait for.
func (w *asyncWrite) wait() error {
	if w == nil {
		return nil
	}
	<-w.done
	return w.err
}

// clearIntent removes sb's rollback intent (either form).
func (e *Engine) clearIntent(sb *delta.Sandbox) error {
	removed := false
	for _, p := range []string{e.home.intentFile(sb), e.home.legacyIntentFile(sb.Name)} {
		err := os.Remove(p)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("sandbox %s: rollback intent: %w", sb.Name, err)
		}
		removed = removed || err == nil
	}
	if !removed {
		return nil
	}
	return fsat.SyncDir(e.home.intentsDir())
}

// pendingRollback returns the interrupted rollback of sb, if there is one.
// An intent of the older, name-keyed form is sb's only if it was written
// after sb was created: one older belongs to a removed sandbox of the same
// name, and is dropped.
func (e *Engine) pendingRollback(sb *delta.Sandbox) (rollbackIntent, bool) {
	p := e.home.intentFile(sb)
	data, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		p = e.home.legacyIntentFile(sb.Name)
		fi, serr := os.Stat(p)
		if serr != nil {
			return rollbackIntent{}, false
		}
		if !sb.Created.IsZero() && fi.ModTime().Before(sb.Created) {
			e.log.Warn("dropped a rollback intent of a removed sandbox of the same name", "sandbox", sb.Name, "written", fi.ModTime())
			os.Remove(p)
			return rollbackIntent{}, false
		}
		data, err = os.ReadFile(p)
	}
	if err != nil {
		return rollbackIntent{}, false
	}
	in, err := parseIntent(string(data))
	if err != nil {
		// A torn intent: the rename makes that impossible, but if it
		// happens the rollback had not started its switch.
		e.log.Warn("unreadable rollback intent dropped", "sandbox", sb.Name, "err", err)
		os.Remove(p)
		return rollbackIntent{}, false
	}
	return in, true
}

func parseIntent(s string) (rollbackIntent, error) {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	id, err := delta.ParseID(strings.TrimSpace(lines[0]))
	if err != nil {
		return rollbackIntent{}, err
	}
	in := rollbackIntent{Target: id}
	for _, l := range lines[1:] {
		if strings.TrimSpace(l) == "processes" {
			in.Processes = true
		}
	}
	return in, nil
}

// interrupted reports what an interrupted operation left on sb, without
// finishing or changing anything (nil: nothing).
func (e *Engine) interrupted(sb *delta.Sandbox) *Interrupted {
	var out Interrupted
	if in, ok := e.pendingRollback(sb); ok {
		id := in.Target
		out.Rollback = &id
	}
	if b, err := os.ReadFile(e.home.procsLostFile(sb)); err == nil {
		out.ProcessesLost = strings.TrimSpace(string(b))
		if out.ProcessesLost == "" {
			out.ProcessesLost = "reason not recorded"
		}
	}
	if out.Rollback == nil && out.ProcessesLost == "" {
		return nil
	}
	return &out
}

// noteProcsLost records that sb's processes were meant to run again and do
// not, so that every later command says so instead of nobody.
func (e *Engine) noteProcsLost(sb *delta.Sandbox, why string) {
	e.log.Warn("processes not restored", "sandbox", sb.Name, "why", why)
	if err := ensureDir(e.home.intentsDir()); err == nil {
		err = writeDurable(e.home.procsLostFile(sb), why+"\n")
		if err != nil {
			e.log.Warn("processes-not-restored state not recorded", "sandbox", sb.Name, "err", err)
		}
	}
}

// clearProcsLost forgets that note: the sandbox's processes were replaced
// (a container started, a rollback) or the sandbox is gone.
func (e *Engine) clearProcsLost(sb *delta.Sandbox) {
	os.Remove(e.home.procsLostFile(sb))
}

// finishRollback completes an interrupted rollback of st: root restored to
// its target (again, if it already was), head moved there, and the
// target's processes started again if the rollback was to restore them.
// Processes that cannot be restored leave the sandbox marked (noteProcsLost)
// rather than failing the command that found the intent.
func (e *Engine) finishRollback(ctx context.Context, name string, st *sandboxState, in rollbackIntent) error {
	e.log.Warn("finishing an interrupted rollback", "sandbox", name, "checkpoint", in.Target.Short())
	var cp *delta.Checkpoint
	err := e.view(ctx, func(tx *catalog.Tx) (err error) { cp, err = tx.Checkpoint(in.Target); return err })
	if err != nil {
		// The target is unknown here (a rebuilt catalog without it): the
		// head is what stands, so the root goes back to the head.
		e.log.Warn("rollback target unknown; restoring the head instead", "sandbox", name, "err", err)
		cp = st.head
	} else if cp.BaseTree != st.head.BaseTree {
		// Not a rollback this sandbox could have started (Rollback refuses
		// another base): an intent that outlived its sandbox.
		e.log.Warn("rollback intent names a checkpoint on another base; dropped", "sandbox", name, "checkpoint", cp.ID.Short())
		return e.clearIntent(st.sb)
	}
	e.untrack(name) // a restore remounts the root; the next turn walks
	if err := e.procs.Stop(ctx, name); err != nil {
		return err
	}
	if err := st.root.Restore(rootfs.WithPhase(ctx, e.phase), cp.FSTree, e.repo); err != nil {
		return fmt.Errorf("sandbox %s: finish interrupted rollback to %s: %w", name, cp.ID.Short(), err)
	}
	if err := e.moveHead(ctx, name, st.sb, cp.ID); err != nil {
		return err
	}
	st.head = cp
	if in.Processes && cp.ProcTree != nil && cp.ID == in.Target {
		if err := e.finishProcesses(ctx, name, st, cp); err != nil {
			e.noteProcsLost(st.sb, fmt.Sprintf("the interrupted rollback to %s was finished for files; its processes: %v", cp.ID.Short(), err))
		} else {
			e.clearProcsLost(st.sb)
			e.log.Warn("restored the processes of the interrupted rollback", "sandbox", name, "checkpoint", cp.ID.Short())
		}
	}
	return e.clearIntent(st.sb)
}

// finishProcesses starts checkpoint cp's processes on st's restored root,
// as the interrupted rollback would have.
func (e *Engine) finishProcesses(ctx context.Context, name string, st *sandboxState, cp *delta.Checkpoint) error {
	if err := e.procs.CheckHost(ctx, cp); err != nil {
		return err
	}
	img, clean, err := e.readyImage(ctx, cp, false)
	if err != nil {
		return err
	}
	defer clean()
	if err := e.procs.Restore(ctx, name, st.root.Path(), img, cp); err != nil {
		return err
	}
	e.acceptRestored(ctx, name, st.root, cp) // restoreturn.go
	return nil
}

// moveHead points the sandbox's head at id: the ref object, then the catalog.
func (e *Engine) moveHead(ctx context.Context, name string, sb *delta.Sandbox, id delta.ID) error {
	return e.moveHeadAfter(ctx, name, sb, id, nil)
}

// putHead writes the sandbox's head ref object. It is stored under the
// sandbox's key (its id), so two homes' sandboxes of one name never share
// a head (FORMAT.md).
func (e *Engine) putHead(ctx context.Context, sb *delta.Sandbox, id delta.ID) error {
	return e.putRefObject(ctx, delta.RefHead, sb.Key(), id)
}

// moveHeadAfter is moveHead whose ref object put (putHead of id) was
// started already; nil: it is written here.
func (e *Engine) moveHeadAfter(ctx context.Context, name string, sb *delta.Sandbox, id delta.ID, put *asyncWrite) error {
	err := put.wait() // nil-safe
	if put == nil {
		err = e.putHead(ctx, sb, id)
	}
	if err != nil {
		return err
	}
	err = e.cat.Update(ctx, func(tx *catalog.Tx) error {
		if err := e.rem.QueueRef(tx, name, delta.RefName(delta.RefHead, sb.Key()), id, ""); err != nil {
			return err
		}
		return tx.SetRef(delta.Ref{Kind: delta.RefHead, Name: name, Target: id})
	})
	if err != nil {
		return fmt.Errorf("sandbox %s: move head to %s: %w", name, id.Short(), err)
	}
	return nil
}

// AbandonRollback discards the sandbox's interrupted rollback without
// finishing it: the root goes back to the head (the catalog's, which the
// rollback had not moved yet) and the head's ref object names it again.
// The processes the rollback stopped stay stopped (the sandbox is marked
// so: ps and status say it). No interrupted rollback is ErrPrecondition.
func (e *Engine) AbandonRollback(ctx context.Context, name string) (*RestoreResult, error) {
	done, err := e.op(ctx, name)
	if err != nil {
		return nil, err
	}
	defer done()
	start := time.Now()
	st, err := e.viewSandbox(ctx, name)
	if err != nil {
		return nil, err
	}
	if err := e.rem.MustOwn(st.sb, st.owner, st.head.ID); err != nil {
		return nil, err
	}
	in, ok := e.pendingRollback(st.sb)
	if !ok {
		return nil, fmt.Errorf("sandbox %s has no interrupted rollback to abandon: %w", name, errdefs.ErrPrecondition)
	}
	e.log.Warn("abandoning an interrupted rollback", "sandbox", name, "checkpoint", in.Target.Short(), "head", st.head.ID.Short())
	e.untrack(name)
	if err := e.procs.Stop(ctx, name); err != nil {
		return nil, err
	}
	if _, err := os.Stat(e.home.sandboxDir(name)); err != nil {
		return nil, fmt.Errorf("sandbox %s: root: %w", name, err)
	}
	if err := st.root.Restore(ctx, st.head.FSTree, e.repo); err != nil {
		return nil, fmt.Errorf("sandbox %s: abandon the rollback to %s: restore the head %s: %w", name, in.Target.Short(), st.head.ID.Short(), err)
	}
	// The rollback wrote the target into the head's ref object beside its
	// rewrite; the catalog's head is the one that stands.
	if err := e.moveHead(ctx, name, st.sb, st.head.ID); err != nil {
		return nil, err
	}
	if in.Processes || st.head.ProcTree != nil {
		e.noteProcsLost(st.sb, fmt.Sprintf("the rollback to %s was abandoned after it stopped them (roll back to %s to start the head's again)",
			in.Target.Short(), st.head.ID.Short()))
	}
	if err := e.clearIntent(st.sb); err != nil {
		return nil, err
	}
	return &RestoreResult{Sandbox: name, Checkpoint: st.head, Root: st.root.Path(), Duration: time.Since(start)}, nil
}
