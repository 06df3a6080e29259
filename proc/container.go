package proc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Status is a container's state as runc reports it.
type Status string

// The statuses a started container can be in.
const (
	Running Status = "running"
	Paused  Status = "paused"
	Stopped Status = "stopped"
	Created Status = "created"
)

// ContainerState describes one container.
type ContainerState struct {
	ID     string `json:"id"`
	Status Status `json:"status"`
	// InitPID is the container init's pid on the host (0 when stopped).
	InitPID int       `json:"pid"`
	Bundle  string    `json:"bundle"`
	Rootfs  string    `json:"rootfs"`
	Created time.Time `json:"created"`
}

// stdioWait bounds how long Start waits for a new init to let go of runc's
// stdio (the keeper does so in its first statement).
const stdioWait = 10 * time.Second

// Start creates container id around rootfs (a directory: the sandbox root)
// and starts its init, detached. The rootfs needs /bin/sh (see
// StartOptions.Init); runc creates /proc, /dev and /sys in it if missing.
// An id in use is ErrExists.
func (r *Runtime) Start(ctx context.Context, id, rootfs string, opts StartOptions) error {
	if err := checkID(id); err != nil {
		return err
	}
	if st, err := os.Stat(rootfs); err != nil || !st.IsDir() {
		return fmt.Errorf("container %s: rootfs %s is not a directory: %w", id, rootfs, errdefs.ErrInvalid)
	}
	if r.exists(id) {
		return fmt.Errorf("container %s: %w", id, errdefs.ErrExists)
	}
	bundle, err := r.writeBundle(id, rootfs, opts)
	if err != nil {
		_ = r.Delete(context.WithoutCancel(ctx), id)
		return err
	}
	cmd := exec.CommandContext(ctx, r.cfg.Runc, "--root", runcRoot(r.cfg.StateRoot),
		"run", "--detach", "--bundle", bundle, id)
	// Pipes, not files: the init inherits these until it redirects its
	// stdio, and Wait returns only once it has let go of them, so a
	// container returned by Start holds no fd of runc's.
	var out capped
	cmd.Stdin, cmd.Stdout, cmd.Stderr = emptyReader{}, &out, &out
	cmd.WaitDelay = stdioWait
	err = cmd.Run()
	r.log.Debug("runc run", "id", id, "rootfs", rootfs, "err", err)
	if errors.Is(err, exec.ErrWaitDelay) {
		_ = r.Delete(context.WithoutCancel(ctx), id)
		return fmt.Errorf("container %s: init %q kept runc's stdio open for %v; it must redirect its stdio inside the container (see StartOptions.Init): %w",
			id, opts.withDefaults().Init, stdioWait, errdefs.ErrInvalid)
	}
	if err != nil {
		_ = r.Delete(context.WithoutCancel(ctx), id)
		return fmt.Errorf("container %s: start: %s", id, runcMessage(out.Bytes(), err))
	}
	return nil
}

// exists reports whether runc knows container id.
func (r *Runtime) exists(id string) bool {
	_, err := os.Stat(filepath.Join(runcRoot(r.cfg.StateRoot), id))
	return err == nil
}

// Delete kills every process of container id and removes the container,
// its cgroups, its network namespace and its bundle. Deleting an absent container is not an error,
// so cleanup paths can call it unconditionally.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if r.exists(id) {
		if _, err := r.runc(ctx, nil, "delete", "--force", id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("container %s: %w", id, err)
		}
		if err := r.removeDeadState(id); err != nil { // deadstate.go
			return err
		}
	}
	if err := removeNetns(r.netnsPath(id)); err != nil {
		return fmt.Errorf("container %s: %w", id, err)
	}
	if err := os.RemoveAll(r.bundle(id)); err != nil {
		return fmt.Errorf("container %s: bundle: %w", id, err)
	}
	return nil
}

// Pause freezes every process of container id (the cgroup freezer): they
// stay frozen, in the middle of whatever they did, until Resume. This is
// the consistent cut: files scanned while paused and a Checkpoint taken
// while paused describe one instant.
//
// Pause first records the calling process as the freeze's holder (in the
// bundle, see Freeze), so a freeze whose holder died (a turnsnap killed
// mid-checkpoint) can be told from one in progress and undone.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := writeSynced(r.freezeFile(id), []byte(Self().String()+"\n")); err != nil {
		return fmt.Errorf("container %s: freeze holder: %w", id, err)
	}
	if _, err := r.runc(ctx, nil, "pause", id); err != nil {
		os.Remove(r.freezeFile(id))
		return fmt.Errorf("container %s: %w", id, err)
	}
	return nil
}

// Resume thaws a paused container and forgets the freeze's holder.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if _, err := r.runc(ctx, nil, "resume", id); err != nil {
		return fmt.Errorf("container %s: %w", id, err)
	}
	os.Remove(r.freezeFile(id))
	return nil
}

// FreezeState says whether a container is frozen and by whom.
type FreezeState struct {
	Frozen bool
	// Holder is the process whose Pause froze it, when it is known (Pause
	// records it; a freeze made by `runc pause` by hand has none).
	Holder      Holder
	HolderKnown bool
}

// Stale reports a freeze no live process holds: its holder is unknown or
// dead. Nothing will ever resume such a container by itself.
func (f FreezeState) Stale() bool { return f.Frozen && !(f.HolderKnown && f.Holder.Alive()) }

// Freeze returns container id's freeze state. It reads runc's state file
// and the freezer cgroup and spawns nothing.
func (r *Runtime) Freeze(id string) (FreezeState, error) {
	if err := checkID(id); err != nil {
		return FreezeState{}, err
	}
	ci, err := r.info(id)
	if err != nil {
		return FreezeState{}, err
	}
	fs := FreezeState{Frozen: ci.alive() && ci.frozen()}
	if b, err := os.ReadFile(r.freezeFile(id)); err == nil {
		fs.Holder, fs.HolderKnown = ParseHolder(string(b))
	}
	return fs, nil
}

func (r *Runtime) freezeFile(id string) string { return filepath.Join(r.bundle(id), "frozen-by") }

// writeSynced writes p and syncs it: the freeze's record exists before
// the freeze does, whenever the freezing process dies.
func writeSynced(p string, b []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// WaitUntraced waits, at most wait, until no process of container id is
// traced (ptrace). CRIU seizes every process it dumps and lets go when it
// is done; a CRIU whose turnsnap was killed finishes its dump on its own
// and then puts the freezer back as it found it (frozen), so a command
// that thaws the container first would see it frozen again under its
// feet. Waiting lets it finish (killing CRIU halfway could leave its
// parasite in the processes). A container still traced after wait is
// ErrUnavailable, naming the tracer.
func (r *Runtime) WaitUntraced(ctx context.Context, id string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	seen := map[int]bool{}
	for {
		ci, err := r.info(id)
		if err != nil {
			return err
		}
		pids, err := ci.pids()
		if err != nil {
			return err
		}
		tracer := 0
		for _, pid := range pids {
			if t := tracerOf(pid); t != 0 {
				tracer = t
				seen[t] = true
				break
			}
		}
		if tracer == 0 {
			// CRIU lets go of the processes before it puts the freezer
			// back: a tracer seen is waited for until it has exited.
			for t := range seen {
				if _, err := os.Stat(fmt.Sprintf("/proc/%d", t)); err == nil {
					tracer = t
				}
			}
		}
		if tracer == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("container %s: its processes are still traced by pid %d after %v (a CRIU whose turnsnap is gone?): %w",
				id, tracer, wait, errdefs.ErrUnavailable)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// tracerOf returns the pid tracing process pid, or 0.
func tracerOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "TracerPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// ForgetFreeze removes the record of a freeze whose holder is gone from a
// container that is not frozen (its holder died before or while it
// froze, or it was thawed by hand). It reports whether there was one.
func (r *Runtime) ForgetFreeze(id string) bool {
	fs, err := r.Freeze(id)
	if err != nil || fs.Frozen || !fs.HolderKnown || fs.Holder.Alive() {
		return false
	}
	return os.Remove(r.freezeFile(id)) == nil
}

// Status returns container id's status from runc's state file and the
// freezer cgroup, spawning nothing (a `runc state` costs a process start
// on every turn). An unknown id is ErrNotFound.
func (r *Runtime) Status(id string) (Status, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	ci, err := r.info(id)
	if err != nil {
		return "", err
	}
	switch {
	case !ci.alive():
		return Stopped, nil
	case ci.frozen():
		return Paused, nil
	}
	return Running, nil
}

// State returns container id's state; an unknown id is ErrNotFound.
func (r *Runtime) State(ctx context.Context, id string) (ContainerState, error) {
	if err := checkID(id); err != nil {
		return ContainerState{}, err
	}
	if !r.exists(id) {
		return ContainerState{}, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	out, err := r.runc(ctx, nil, "state", id)
	if err != nil {
		return ContainerState{}, fmt.Errorf("container %s: %w", id, err)
	}
	var st ContainerState
	if err := json.Unmarshal(out, &st); err != nil {
		return ContainerState{}, fmt.Errorf("container %s: runc state: %w", id, err)
	}
	return st, nil
}

// List returns every container of this state root, for reconciling after a
// restart of the service.
func (r *Runtime) List(ctx context.Context) ([]ContainerState, error) {
	out, err := r.runc(ctx, nil, "list", "--format", "json")
	if err != nil {
		return nil, err
	}
	var list []ContainerState
	if err := json.Unmarshal(out, &list); err != nil {
		return nil, fmt.Errorf("runc list: %w", err)
	}
	return list, nil
}

// capped is a bytes buffer that keeps the first 64 KiB written to it: enough
// for any error message, bounded whatever a process prints.
type capped struct{ b []byte }

func (c *capped) Write(p []byte) (int, error) {
	if room := 64<<10 - len(c.b); room > 0 {
		c.b = append(c.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (c *capped) Bytes() []byte { return c.b }
