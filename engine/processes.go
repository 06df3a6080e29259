package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/proc"
)

// Sandbox processes. Each sandbox can run one container (runc, its root as
// rootfs), started by the first Exec. At a turn boundary the engine compares
// the container's long-lived processes with the baseline taken after the
// last process checkpoint (proc.Changed); a change is dumped with CRIU while
// the container is paused for the filesystem scan, so both halves of a
// checkpoint are one instant. The image directory is stored like any
// directory: chunked, deduplicated, packed, a tree (the record's proc_tree).

func containerID(sandbox string) string { return "turnsnap-" + sandbox }

// procStateRoot keeps runc's state on tmpfs (it does not survive a reboot
// anyway), one directory per home so homes never see each other's
// containers.
func (h home) procStateRoot() string {
	sum := sha256.Sum256([]byte(h))
	return filepath.Join("/run/turnsnap", hex.EncodeToString(sum[:6]))
}

func (h home) baselineFile(sandbox string) string {
	return filepath.Join(string(h), "proc", sandbox+".baseline.json")
}

// runtime returns the process runtime, probing runc and CRIU on first use:
// sandboxes that never run processes never need either.
func (e *Engine) runtime(ctx context.Context) (*proc.Runtime, error) {
	e.rtMu.Lock()
	defer e.rtMu.Unlock()
	if e.rt != nil {
		return e.rt, nil
	}
	rt, err := proc.New(ctx, proc.Config{StateRoot: e.home.procStateRoot(), CRIU: e.procCRIU, Logger: e.log})
	if err != nil {
		return nil, fmt.Errorf("process runtime: %w", err)
	}
	e.rt = rt
	return rt, nil
}

// containerRunning reports whether the sandbox's container exists and runs
// (or is paused). It needs no runtime when no container was ever started.
func (e *Engine) containerRunning(ctx context.Context, sandbox string) (bool, error) {
	if _, err := os.Stat(filepath.Join(e.home.procStateRoot(), "runc", containerID(sandbox))); err != nil {
		return false, nil
	}
	rt, err := e.runtime(ctx)
	if err != nil {
		return false, err
	}
	st, err := rt.State(ctx, containerID(sandbox))
	if errors.Is(err, errdefs.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return st.Status == proc.Running || st.Status == proc.Paused, nil
}

// ExecOptions configures Exec.
type ExecOptions struct {
	Detach bool // start a long-lived process and return at once
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// Exec runs argv inside the sandbox's container, starting the container
// on first use. It returns the command's exit code (0 for Detach).
func (e *Engine) Exec(ctx context.Context, name string, argv []string, opts ExecOptions) (int, error) {
	run, err := e.PrepareExec(ctx, name)
	if err != nil {
		return 0, err
	}
	return run(ctx, argv, opts)
}

// ExecFunc runs one command in a prepared sandbox container.
type ExecFunc func(ctx context.Context, argv []string, opts ExecOptions) (int, error)

// PrepareExec mounts the sandbox and starts its container if needed, and
// returns a function that runs commands in it without the engine: the CLI
// closes the engine (freeing the home for other turnsnap commands) before a
// long command runs. A checkpoint taken while such a command still runs is
// refused by the process layer (its parent is outside the container).
func (e *Engine) PrepareExec(ctx context.Context, name string) (ExecFunc, error) {
	st, err := e.loadSandbox(ctx, name)
	if err != nil {
		return nil, err
	}
	if err := st.root.Mount(ctx); err != nil {
		return nil, err
	}
	rt, err := e.runtime(ctx)
	if err != nil {
		return nil, err
	}
	running, err := e.containerRunning(ctx, name)
	if err != nil {
		return nil, err
	}
	id := containerID(name)
	if !running {
		rt.Delete(ctx, id) // a stopped leftover, if any
		if err := rt.Start(ctx, id, st.root.Path(), proc.StartOptions{}); err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", name, err)
		}
	}
	return func(ctx context.Context, argv []string, opts ExecOptions) (int, error) {
		if len(argv) == 0 {
			return 0, fmt.Errorf("sandbox %s: exec needs a command: %w", name, errdefs.ErrInvalid)
		}
		if opts.Detach {
			_, err := rt.ExecDetached(ctx, id, argv, proc.DetachOptions{})
			return 0, err
		}
		in := opts.Stdin
		if in == nil {
			in = eofReader{}
		}
		return rt.Exec(ctx, id, argv, in, orDiscard(opts.Stdout), orDiscard(opts.Stderr))
	}, nil
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// procTurn is the process half of a turn boundary, prepared before the
// filesystem scan: whether processes changed, with the container paused
// (resume must be called) when one runs.
type procTurn struct {
	running bool
	changed bool
	reason  string
	cur     proc.ProcSet
	resume  func()
	paused  time.Duration // how long the cut kept the processes frozen
}

// beginProcTurn snapshots the container's processes and decides whether
// they changed since the last process checkpoint. Changed processes are
// paused at once, so the scan and the dump are one instant. Unchanged ones
// are left running: freezing would itself look like activity next turn,
// and confirmIdle checks after the scan that they stayed idle throughout.
func (e *Engine) beginProcTurn(ctx context.Context, name string, head *delta.Checkpoint) (*procTurn, error) {
	pt := &procTurn{resume: func() {}}
	running, err := e.containerRunning(ctx, name)
	if err != nil {
		return nil, err
	}
	if !running {
		// No processes now: a change only if the last checkpoint had some.
		pt.changed = head.ProcTree != nil
		pt.reason = "long-lived processes ended"
		return pt, nil
	}
	rt, _ := e.runtime(ctx)
	pt.running = true
	if pt.cur, err = rt.Snapshot(ctx, containerID(name)); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	pt.changed, pt.reason = e.procsChanged(name, pt.cur, head)
	if pt.changed {
		return pt, e.pauseTurn(ctx, name, pt)
	}
	return pt, nil
}

func (e *Engine) procsChanged(name string, cur proc.ProcSet, head *delta.Checkpoint) (bool, string) {
	if len(cur.Procs) == 0 {
		return head.ProcTree != nil, "long-lived processes ended"
	}
	if head.ProcTree == nil {
		return true, "processes not yet in any checkpoint"
	}
	return proc.Changed(e.loadBaseline(name), cur)
}

// pauseTurn freezes the container for the cut; pt.resume thaws it.
func (e *Engine) pauseTurn(ctx context.Context, name string, pt *procTurn) error {
	rt, _ := e.runtime(ctx)
	id := containerID(name)
	start := time.Now()
	if err := rt.Pause(ctx, id); err != nil {
		return fmt.Errorf("sandbox %s: pause for a consistent cut: %w", name, err)
	}
	pt.resume = func() {
		if err := rt.Resume(context.WithoutCancel(ctx), id); err != nil {
			e.log.Error("resume after checkpoint failed", "sandbox", name, "err", err)
		}
		pt.paused = time.Since(start)
	}
	return nil
}

// confirmIdle is called after the scan of a turn whose processes were
// unchanged and left running. If they did anything meanwhile, the files just
// scanned may be theirs mid-change: it pauses them and reports that the turn
// must rescan and dump (the cut is then taken properly).
func (e *Engine) confirmIdle(ctx context.Context, name string, pt *procTurn, head *delta.Checkpoint) (bool, error) {
	if !pt.running || pt.changed {
		return false, nil
	}
	rt, _ := e.runtime(ctx)
	cur, err := rt.Snapshot(ctx, containerID(name))
	if err != nil {
		return false, fmt.Errorf("sandbox %s: %w", name, err)
	}
	if changed, reason := e.procsChanged(name, cur, head); changed {
		pt.cur, pt.changed, pt.reason = cur, true, reason+" (during the scan)"
		return true, e.pauseTurn(ctx, name, pt)
	}
	return false, nil
}

// dump captures the paused container into an image directory (the
// container stays paused) and returns a function that stores the image and
// removes the directory. The image is a finished snapshot once CRIU
// returns, so the caller resumes the container before storing it: chunking
// and compressing a 200 MB image takes about a second that the sandbox's
// processes should not spend frozen.
func (e *Engine) dump(ctx context.Context, name string, saver delta.BlobSaver) (store func() (delta.ID, json.RawMessage, error), err error) {
	rt, _ := e.runtime(ctx)
	dir, err := os.MkdirTemp("", "turnsnap-image-")
	if err != nil {
		return nil, err
	}
	meta, err := rt.Checkpoint(ctx, containerID(name), filepath.Join(dir, "img"), proc.DumpOptions{})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	return func() (delta.ID, json.RawMessage, error) {
		defer os.RemoveAll(dir)
		res, err := delta.Scan(ctx, filepath.Join(dir, "img"), delta.ScanOptions{Saver: saver, Quiescent: true})
		if err != nil {
			return delta.ID{}, nil, fmt.Errorf("sandbox %s: store process image: %w", name, err)
		}
		host, err := json.Marshal(meta.Host)
		return res.Root, host, err
	}, nil
}

// settle records the baseline the next turn compares against.
func (e *Engine) settle(ctx context.Context, name string) {
	rt, err := e.runtime(ctx)
	if err != nil {
		return
	}
	set, err := rt.Baseline(ctx, containerID(name))
	if err != nil {
		e.log.Warn("process baseline", "sandbox", name, "err", err)
		return
	}
	data, _ := json.Marshal(set)
	p := e.home.baselineFile(name)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err == nil {
		os.WriteFile(p, data, 0o600)
	}
}

func (e *Engine) loadBaseline(name string) proc.ProcSet {
	var set proc.ProcSet
	if data, err := os.ReadFile(e.home.baselineFile(name)); err == nil {
		json.Unmarshal(data, &set)
	}
	return set
}

// checkHost refuses a process restore the recorded host facts rule out.
func (e *Engine) checkHost(ctx context.Context, cp *delta.Checkpoint) error {
	if cp.ProcTree == nil {
		return nil
	}
	var rec proc.HostFacts
	if err := json.Unmarshal(cp.Host, &rec); err != nil {
		return fmt.Errorf("checkpoint %s: host facts: %v: %w", cp.ID.Short(), err, errdefs.ErrCorrupt)
	}
	rt, err := e.runtime(ctx)
	if err != nil {
		return fmt.Errorf("checkpoint %s has processes but this host cannot run them (%v); restore its files only with --fs-only: %w",
			cp.ID.Short(), err, errdefs.ErrPrecondition)
	}
	if err := proc.CheckRestore(rec, rt.Host()); err != nil {
		return fmt.Errorf("checkpoint %s: %w (use --fs-only to restore its files without its processes)", cp.ID.Short(), err)
	}
	return nil
}

// stopProcesses ends the sandbox's container, if any: a root is replaced
// only with nothing running on it.
func (e *Engine) stopProcesses(ctx context.Context, name string) error {
	running, err := e.containerRunning(ctx, name)
	if err != nil || !running {
		return err
	}
	rt, _ := e.runtime(ctx)
	if err := rt.Delete(ctx, containerID(name)); err != nil {
		return fmt.Errorf("sandbox %s: stop processes: %w", name, err)
	}
	os.Remove(e.home.baselineFile(name))
	return nil
}

// restoreProcesses brings a checkpoint's processes back in the sandbox's
// container, on its (already restored) root.
func (e *Engine) restoreProcesses(ctx context.Context, name, root string, cp *delta.Checkpoint) error {
	rt, err := e.runtime(ctx)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "turnsnap-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	img := filepath.Join(dir, "img")
	if err := os.Mkdir(img, 0o700); err != nil {
		return err
	}
	if _, err := delta.Materialise(ctx, *cp.ProcTree, img, delta.ApplyOptions{Loader: e.repo, Plain: true}); err != nil {
		return fmt.Errorf("checkpoint %s: process image: %w", cp.ID.Short(), err)
	}
	rt.Delete(ctx, containerID(name))
	if _, err := rt.Restore(ctx, containerID(name), root, img, proc.RestoreOptions{}); err != nil {
		return fmt.Errorf("sandbox %s: restore processes of %s: %w", name, cp.ID.Short(), err)
	}
	e.settle(ctx, name)
	return nil
}
