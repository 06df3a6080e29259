package procs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/proc"
)

// Recovery from a turnsnap killed in the middle of a turn. A checkpoint
// freezes the container for its cut and writes process images to disk; a
// SIGKILL at that moment leaves a frozen container that nothing will thaw
// and pages of process memory in a work directory. Both carry the Holder
// (pid and start time) of the process that made them, so the next command
// can tell them from work in progress and undo them.

// ensurePrivateDir makes dir (and parents) and makes sure only root can
// enter it, even if it existed with looser permissions.
func ensurePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}

// work makes a fresh work directory for a process image, named after
// this process (kind-PID.START-RANDOM) so that CleanWork can tell a
// leftover from a directory in use.
func (m *Manager) work(kind string) (string, error) {
	if err := ensurePrivateDir(m.WorkDir()); err != nil {
		return "", err
	}
	return os.MkdirTemp(m.WorkDir(), kind+"-"+proc.Self().String()+"-")
}

// CleanWork removes the work directories of turnsnap processes that
// are gone: images that a killed checkpoint or rollback left behind.
func (m *Manager) CleanWork() {
	ents, err := os.ReadDir(m.WorkDir())
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
		if err := os.RemoveAll(filepath.Join(m.WorkDir(), ent.Name())); err != nil {
			m.d.Log.Warn("leftover process image not removed", "dir", ent.Name(), "err", err)
			continue
		}
		m.d.Log.Warn("removed a process image a killed turnsnap left behind", "dir", ent.Name())
	}
}

// recoverFreeze resumes the sandbox's container if it is frozen and no live
// process holds the freeze (a turnsnap killed mid-checkpoint), and says so.
// It reports whether it resumed the container.
func (m *Manager) recoverFreeze(ctx context.Context, name delta.SandboxName) (bool, error) {
	rt, err := m.Runtime(ctx)
	if err != nil {
		return false, err
	}
	id := m.Container(name).ID
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
	m.d.Log.Warn("sandbox was left frozen by a turnsnap that is gone; resumed it", "sandbox", name, "frozen_by", freezeHolder(fs))
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

// ResumeResult reports Resume.
type ResumeResult struct {
	Sandbox string
	// WasFrozen says the container was frozen and is now running.
	WasFrozen bool
	// FrozenBy names the process that froze it, when known.
	FrozenBy string
}

// Resume thaws the sandbox's container whoever froze it: the operator's
// way out when a container stays paused. A sandbox without a running
// container is ErrPrecondition.
func (m *Manager) Resume(ctx context.Context, name delta.SandboxName) (*ResumeResult, error) {
	_, done, err := m.d.Load(ctx, name, true)
	if err != nil {
		return nil, err
	}
	defer done()
	id := m.Container(name).ID
	if _, err := os.Stat(filepath.Join(m.StateRoot(), "runc", id)); err != nil {
		return nil, fmt.Errorf("sandbox %s has no container: %w", name, errdefs.ErrPrecondition)
	}
	rt, err := m.Runtime(ctx)
	if err != nil {
		return nil, err
	}
	fs, err := rt.Freeze(id)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	res := &ResumeResult{Sandbox: string(name)}
	if !fs.Frozen {
		return res, nil
	}
	if err := rt.Resume(ctx, id); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	res.WasFrozen, res.FrozenBy = true, freezeHolder(fs)
	return res, nil
}

// Recover is the process half of the engine's check of a sandbox after a
// crash (engine.Recover): a container a killed turnsnap left frozen is
// resumed (resumed), and running says whether the container runs. A
// sandbox that never had a container needs no runtime.
func (m *Manager) Recover(ctx context.Context, name delta.SandboxName) (resumed, running bool, err error) {
	c := m.Container(name)
	id := c.ID
	if _, err := os.Stat(filepath.Join(m.StateRoot(), "runc", id)); err != nil {
		return false, false, nil
	}
	rt, err := m.Runtime(ctx)
	if err != nil {
		return false, false, err
	}
	if fs, err := rt.Freeze(id); err == nil && fs.Frozen && fs.Stale() {
		if _, err := m.recoverFreeze(ctx, name); err != nil {
			return false, false, err
		}
		resumed = true
	}
	running, err = m.Running(ctx, c)
	return resumed, running, err
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
func (m *Manager) watchFreeze(ctx context.Context, name delta.SandboxName, rt *proc.Runtime) (stop func()) {
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
			if fs, err := rt.Freeze(m.Container(name).ID); err == nil && fs.Stale() {
				if _, err := m.recoverFreeze(ctx, name); err != nil {
					m.d.Log.Warn("a stale freeze of a running exec's container not thawed", "sandbox", name, "err", err)
				}
			}
		}
	}()
	return func() { cancel(); <-done }
}
