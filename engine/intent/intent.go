// Package intent keeps the records of interrupted operations in the
// home's intents directory, and the rules that finish or discard them.
package intent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

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

func (s *Intents) intentFile(sb *delta.Sandbox) string {
	return filepath.Join(s.d.Dir, string(sb.Key())+".rollback")
}

// legacyIntentFile is where turnsnap before issue 24 kept the intent.
func (s *Intents) legacyIntentFile(name string) string {
	return filepath.Join(s.d.Dir, "rollback-"+name)
}

func (s *Intents) procsLostFile(sb *delta.Sandbox) string {
	return filepath.Join(s.d.Dir, string(sb.Key())+".procs-lost")
}

// Rollback is an interrupted rollback as its intent file says.
type Rollback struct {
	Target delta.ID
	// Processes: the rollback was to restore Target's processes too.
	Processes bool
}

// Interrupted says what an interrupted operation left on a sandbox, for
// commands that report it rather than finish it (ps, diff, status). It is
// declared with the process listing that reports it (procs.ProcessList).
type Interrupted = procs.Interrupted

// Write records sb's rollback to in.Target, durably.
func (s *Intents) Write(sb *delta.Sandbox, in Rollback) error {
	p := s.intentFile(sb)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	body := in.Target.String() + "\nsandbox " + string(sb.Name) + "\n"
	if in.Processes {
		body += "processes\n"
	}
	if err := fsat.WriteFileDurable(p, body); err != nil {
		return fmt.Errorf("sandbox %s: rollback intent: %w", sb.Name, err)
	}
	return nil
}

// Clear removes sb's rollback intent (either form).
func (s *Intents) Clear(sb *delta.Sandbox) error {
	removed := false
	for _, p := range []string{s.intentFile(sb), s.legacyIntentFile(string(sb.Name))} {
		err := os.Remove(p)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("sandbox %s: rollback intent: %w", sb.Name, err)
		}
		removed = removed || err == nil
	}
	if !removed {
		return nil
	}
	return fsat.SyncDir(s.d.Dir)
}

// Pending returns the interrupted rollback of sb, if there is one.
// An intent of the older, name-keyed form is sb's only if it was written
// after sb was created: one older belongs to a removed sandbox of the same
// name, and is dropped.
func (s *Intents) Pending(sb *delta.Sandbox) (Rollback, bool) {
	p := s.intentFile(sb)
	data, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		p = s.legacyIntentFile(string(sb.Name))
		fi, serr := os.Stat(p)
		if serr != nil {
			return Rollback{}, false
		}
		if !sb.Created.IsZero() && fi.ModTime().Before(sb.Created) {
			s.d.Log.Warn("dropped a rollback intent of a removed sandbox of the same name", "sandbox", sb.Name, "written", fi.ModTime())
			os.Remove(p)
			return Rollback{}, false
		}
		data, err = os.ReadFile(p)
	}
	if err != nil {
		return Rollback{}, false
	}
	in, err := parseIntent(string(data))
	if err != nil {
		// A torn intent: the rename makes that impossible, but if it
		// happens the rollback had not started its switch.
		s.d.Log.Warn("unreadable rollback intent dropped", "sandbox", sb.Name, "err", err)
		os.Remove(p)
		return Rollback{}, false
	}
	return in, true
}

func parseIntent(s string) (Rollback, error) {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	id, err := delta.ParseID(strings.TrimSpace(lines[0]))
	if err != nil {
		return Rollback{}, err
	}
	in := Rollback{Target: id}
	for _, l := range lines[1:] {
		if strings.TrimSpace(l) == "processes" {
			in.Processes = true
		}
	}
	return in, nil
}

// Interrupted reports what an interrupted operation left on sb, without
// finishing or changing anything (nil: nothing).
func (s *Intents) Interrupted(sb *delta.Sandbox) *Interrupted {
	var out Interrupted
	if in, ok := s.Pending(sb); ok {
		id := in.Target
		out.Rollback = &id
	}
	if b, err := os.ReadFile(s.procsLostFile(sb)); err == nil {
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

// NoteProcsLost records that sb's processes were meant to run again and do
// not, so that every later command says so instead of nobody.
func (s *Intents) NoteProcsLost(sb *delta.Sandbox, why string) {
	s.d.Log.Warn("processes not restored", "sandbox", sb.Name, "why", why)
	if err := os.MkdirAll(s.d.Dir, 0o700); err == nil {
		err = fsat.WriteFileDurable(s.procsLostFile(sb), why+"\n")
		if err != nil {
			s.d.Log.Warn("processes-not-restored state not recorded", "sandbox", sb.Name, "err", err)
		}
	}
}

// ClearProcsLost forgets that note: the sandbox's processes were replaced
// (a container started, a rollback) or the sandbox is gone.
func (s *Intents) ClearProcsLost(sb *delta.Sandbox) {
	os.Remove(s.procsLostFile(sb))
}

// Finish completes an interrupted rollback of st: root restored to
// its target (again, if it already was), head moved there, and the
// target's processes started again if the rollback was to restore them.
// Processes that cannot be restored leave the sandbox marked (NoteProcsLost)
// rather than failing the command that found the intent. It returns the
// sandbox's head after it.
func (s *Intents) Finish(ctx context.Context, name string, st Sandbox, in Rollback) (*delta.Checkpoint, error) {
	s.d.Log.Warn("finishing an interrupted rollback", "sandbox", name, "checkpoint", in.Target.Short())
	cp, err := s.d.Checkpoint(ctx, in.Target)
	if err != nil {
		// The target is unknown here (a rebuilt catalog without it): the
		// head is what stands, so the root goes back to the head.
		s.d.Log.Warn("rollback target unknown; restoring the head instead", "sandbox", name, "err", err)
		cp = st.Head
	} else if cp.BaseTree != st.Head.BaseTree {
		// Not a rollback this sandbox could have started (Rollback refuses
		// another base): an intent that outlived its sandbox.
		s.d.Log.Warn("rollback intent names a checkpoint on another base; dropped", "sandbox", name, "checkpoint", cp.ID.Short())
		return st.Head, s.Clear(st.Sandbox)
	}
	s.d.Untrack(name) // a restore remounts the root; the next turn walks
	if err := s.d.Procs.Stop(ctx, st.Container); err != nil {
		return st.Head, err
	}
	if err := st.Root.Restore(rootfs.WithPhase(ctx, s.d.Phase), cp.FSTree, s.d.Loader); err != nil {
		return st.Head, fmt.Errorf("sandbox %s: finish interrupted rollback to %s: %w", name, cp.ID.Short(), err)
	}
	if err := s.d.MoveHead(ctx, name, st.Sandbox, cp.ID); err != nil {
		return st.Head, err
	}
	if in.Processes && cp.ProcTree != nil && cp.ID == in.Target {
		if err := s.finishProcesses(ctx, name, st.Container, st.Root, cp); err != nil {
			s.NoteProcsLost(st.Sandbox, fmt.Sprintf("the interrupted rollback to %s was finished for files; its processes: %v", cp.ID.Short(), err))
		} else {
			s.ClearProcsLost(st.Sandbox)
			s.d.Log.Warn("restored the processes of the interrupted rollback", "sandbox", name, "checkpoint", cp.ID.Short())
		}
	}
	return cp, s.Clear(st.Sandbox)
}

// finishProcesses starts checkpoint cp's processes on the restored root,
// as the interrupted rollback would have.
func (s *Intents) finishProcesses(ctx context.Context, name string, c procs.Container, root rootfs.Root, cp *delta.Checkpoint) error {
	if err := s.d.Procs.CheckHost(ctx, cp); err != nil {
		return err
	}
	img, clean, err := s.d.ReadyImage(ctx, cp, false)
	if err != nil {
		return err
	}
	defer clean()
	if err := s.d.Procs.Restore(ctx, c, root.Path(), img, cp); err != nil {
		return err
	}
	s.d.AcceptRestored(ctx, name, root, cp) // engine/receipt
	return nil
}

// Abandon discards the sandbox's interrupted rollback without
// finishing it: the root goes back to the head (the catalog's, which the
// rollback had not moved yet) and the head's ref object names it again.
// The processes the rollback stopped stay stopped (the sandbox is marked
// so: ps and status say it). No interrupted rollback is ErrPrecondition.
// The caller holds the sandbox's lock and has checked it may write it.
func (s *Intents) Abandon(ctx context.Context, name string, st Sandbox) error {
	in, ok := s.Pending(st.Sandbox)
	if !ok {
		return fmt.Errorf("sandbox %s has no interrupted rollback to abandon: %w", name, errdefs.ErrPrecondition)
	}
	s.d.Log.Warn("abandoning an interrupted rollback", "sandbox", name, "checkpoint", in.Target.Short(), "head", st.Head.ID.Short())
	s.d.Untrack(name)
	if err := s.d.Procs.Stop(ctx, st.Container); err != nil {
		return err
	}
	if _, err := os.Stat(st.Dir); err != nil {
		return fmt.Errorf("sandbox %s: root: %w", name, err)
	}
	if err := st.Root.Restore(ctx, st.Head.FSTree, s.d.Loader); err != nil {
		return fmt.Errorf("sandbox %s: abandon the rollback to %s: restore the head %s: %w", name, in.Target.Short(), st.Head.ID.Short(), err)
	}
	// The rollback wrote the target into the head's ref object beside its
	// rewrite; the catalog's head is the one that stands.
	if err := s.d.MoveHead(ctx, name, st.Sandbox, st.Head.ID); err != nil {
		return err
	}
	if in.Processes || st.Head.ProcTree != nil {
		s.NoteProcsLost(st.Sandbox, fmt.Sprintf("the rollback to %s was abandoned after it stopped them (roll back to %s to start the head's again)",
			in.Target.Short(), st.Head.ID.Short()))
	}
	return s.Clear(st.Sandbox)
}
