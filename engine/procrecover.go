package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/proc"
)

// Recovery from a turnsnap killed in the middle of a turn. A checkpoint
// freezes the container for its cut and writes process images to disk; a
// SIGKILL at that moment leaves a frozen container that nothing will thaw
// and pages of process memory in a work directory. Both carry the Holder
// (pid and start time) of the process that made them, so the next command
// can tell them from work in progress and undo them.

// Checkpoint phases, in order, as Options.AtPhase reports them.
const (
	PhaseFreeze = "freeze" // the container was just paused for the cut
	PhaseScan   = "scan"   // the sandbox root was scanned (still paused if processes changed)
	PhaseDump   = "dump"   // CRIU wrote the image; the container is still paused
	PhaseStore  = "store"  // the container runs again; the image is about to be stored
	PhaseCommit = "commit" // everything is stored; the checkpoint is about to be committed
	// PhaseRecorded: the packs, the record and the head ref are in the
	// store; the catalog transaction that indexes a small turn's blobs and
	// adds the checkpoint is next.
	PhaseRecorded = "recorded"
	// PhaseCommitGroup: the catalog transaction that several concurrent
	// checkpoints share (a group commit) holds all their writes and is
	// about to commit.
	PhaseCommitGroup = "commit-group"
)

// progressPhase shows the step under way in the progress report (Options.
// Progress), with the bytes it will handle when known (0: unknown).
func (e *Engine) progressPhase(name string, total int64) { e.meter.SetPhase(name, total) }

// phase reports reaching a checkpoint phase to Options.AtPhase.
func (e *Engine) phase(name string) {
	if e.atPhase != nil {
		e.atPhase(name)
	}
}

// ensurePrivateDir makes dir (and parents) and makes sure only root can
// enter it, even if it existed with looser permissions.
func ensurePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}

// procWork makes a fresh work directory for a process image, named after
// this process (kind-PID.START-RANDOM) so that cleanProcWork can tell a
// leftover from a directory in use.
func (e *Engine) procWork(kind string) (string, error) {
	if err := ensurePrivateDir(e.home.procWorkDir()); err != nil {
		return "", err
	}
	return os.MkdirTemp(e.home.procWorkDir(), kind+"-"+proc.Self().String()+"-")
}

// cleanProcWork removes the work directories of turnsnap processes that
// are gone: images that a killed checkpoint or rollback left behind.
func (e *Engine) cleanProcWork() {
	ents, err := os.ReadDir(e.home.procWorkDir())
	if err != nil {
		return
	}
	for _, ent := range ents {
		parts := strings.SplitN(ent.Name(), "-", 3)
		if len(parts) == 3 {
			if h, ok := proc.ParseHolder(parts[1]); ok && h.Alive() {
				continue
			}
		}
		if err := os.RemoveAll(filepath.Join(e.home.procWorkDir(), ent.Name())); err != nil {
			e.log.Warn("leftover process image not removed", "dir", ent.Name(), "err", err)
			continue
		}
		e.log.Warn("removed a process image a killed turnsnap left behind", "dir", ent.Name())
	}
}

// recoverFreeze resumes the sandbox's container if it is frozen and no live
// process holds the freeze (a turnsnap killed mid-checkpoint), and says so.
// It reports whether it resumed the container.
func (e *Engine) recoverFreeze(ctx context.Context, name string) (bool, error) {
	rt, err := e.runtime(ctx)
	if err != nil {
		return false, err
	}
	id := e.home.containerID(name)
	fs, err := rt.Freeze(id)
	if err != nil {
		return false, err
	}
	if fs.HolderKnown && !fs.Holder.Alive() {
		// Its freezer died: its CRIU may still be dumping, and will freeze
		// the container again when it is done. Let it finish first.
		if err := rt.WaitUntraced(ctx, id, orphanDumpWait); err != nil {
			return false, fmt.Errorf("sandbox %s: %w", name, err)
		}
		if fs, err = rt.Freeze(id); err != nil {
			return false, err
		}
	}
	if !fs.Stale() {
		rt.ForgetFreeze(id) // a record its dead holder left on a thawed container
		return false, nil
	}
	if err := rt.Resume(ctx, id); err != nil {
		if now, serr := rt.Freeze(id); serr == nil && !now.Frozen {
			rt.ForgetFreeze(id) // thawed meanwhile (its freezer let go): nothing left to do
			return false, nil
		}
		return false, fmt.Errorf("sandbox %s: left frozen by %s; resume failed: %w", name, freezeHolder(fs), err)
	}
	e.log.Warn("sandbox was left frozen by a turnsnap that is gone; resumed it", "sandbox", name, "frozen_by", freezeHolder(fs))
	return true, nil
}

func freezeHolder(fs proc.FreezeState) string {
	if !fs.HolderKnown {
		return "an unknown process"
	}
	state := "gone"
	if fs.Holder.Alive() {
		state = "still running"
	}
	return fmt.Sprintf("pid %d (%s)", fs.Holder.PID, state)
}

// ResumeResult reports ResumeSandbox.
type ResumeResult struct {
	Sandbox string
	// WasFrozen says the container was frozen and is now running.
	WasFrozen bool
	// FrozenBy names the process that froze it, when known.
	FrozenBy string
}

// ResumeSandbox thaws the sandbox's container whoever froze it: the
// operator's way out when a container stays paused. A sandbox without a
// running container is ErrPrecondition.
func (e *Engine) ResumeSandbox(ctx context.Context, name string) (*ResumeResult, error) {
	done, err := e.op(ctx, name)
	if err != nil {
		return nil, err
	}
	defer done()
	if _, err := e.loadSandbox(ctx, name); err != nil {
		return nil, err
	}
	id := e.home.containerID(name)
	if _, err := os.Stat(filepath.Join(e.home.procStateRoot(), "runc", id)); err != nil {
		return nil, fmt.Errorf("sandbox %s has no container: %w", name, errdefs.ErrPrecondition)
	}
	rt, err := e.runtime(ctx)
	if err != nil {
		return nil, err
	}
	fs, err := rt.Freeze(id)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	res := &ResumeResult{Sandbox: name}
	if !fs.Frozen {
		return res, nil
	}
	if err := rt.Resume(ctx, id); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	res.WasFrozen, res.FrozenBy = true, freezeHolder(fs)
	return res, nil
}

// orphanDumpWait bounds the wait for a dump whose turnsnap was killed
// (a CRIU dump of a sandbox takes well under a second per 100 MB).
const orphanDumpWait = time.Minute

// freezeWatchInterval is how often a running exec checks its container
// for a freeze nobody holds.
const freezeWatchInterval = 200 * time.Millisecond

// watchFreeze thaws the sandbox's container, for as long as an exec into
// it runs, whenever it is frozen and no live process holds the freeze: a
// command in a frozen cgroup would otherwise wait for ever (a freeze a
// killed turnsnap's last runc made after the exec began). A freeze a live
// checkpoint holds is left alone: it ends with the checkpoint's cut. The
// returned function stops the watch.
func (e *Engine) watchFreeze(ctx context.Context, name string, rt *proc.Runtime) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(freezeWatchInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if fs, err := rt.Freeze(e.home.containerID(name)); err == nil && fs.Stale() {
				if _, err := e.recoverFreeze(ctx, name); err != nil {
					e.log.Warn("a stale freeze of a running exec's container not thawed", "sandbox", name, "err", err)
				}
			}
		}
	}()
	return func() { cancel(); <-done }
}
