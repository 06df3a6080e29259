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
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
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

// scope names the home on this host: a short hash of its path. It goes into
// container ids and, through the runtime's state root, cgroup paths, so two
// homes with a sandbox of the same name never share a container, a cgroup
// or a freeze.
func (h home) scope() string {
	sum := sha256.Sum256([]byte(h))
	return hex.EncodeToString(sum[:6])
}

// containerID is the runc id of a sandbox's container: ts-SCOPE-NAME.
func (h home) containerID(sandbox string) string { return "ts-" + h.scope() + "-" + sandbox }

// procStateRoot keeps runc's state on tmpfs (it does not survive a reboot
// anyway), one directory per home so homes never see each other's
// containers.
func (h home) procStateRoot() string { return filepath.Join("/run/turnsnap", h.scope()) }

// procDir holds the home's process bookkeeping: baselines, the cached host
// probe, and work/ for process images on their way to or from the store
// (process memory, so secrets: 0700, and leftovers of a killed turnsnap are
// removed by the next command, see cleanProcWork).
func (h home) procDir() string     { return filepath.Join(string(h), "proc") }
func (h home) procWorkDir() string { return filepath.Join(h.procDir(), "work") }

func (h home) baselineFile(sandbox string) string {
	return filepath.Join(h.procDir(), sandbox+".baseline.json")
}

// runtime returns the process runtime, made on first use: sandboxes that
// never run processes never need runc or CRIU. The host probe is cached in
// the home (proc.Config.ProbeCache), so a turn pays for it only after runc,
// CRIU or the kernel changed.
func (e *Engine) runtime(ctx context.Context) (*proc.Runtime, error) {
	e.rtMu.Lock()
	defer e.rtMu.Unlock()
	if e.rt != nil {
		return e.rt, nil
	}
	if err := ensurePrivateDir(e.home.procWorkDir()); err != nil {
		return nil, fmt.Errorf("home %s: %w", e.home, err)
	}
	rt, err := proc.New(ctx, proc.Config{StateRoot: e.home.procStateRoot(), CRIU: e.procCRIU, Logger: e.log,
		ProbeCache: filepath.Join(e.home.procDir(), "host-probe.json")})
	if err != nil {
		return nil, fmt.Errorf("process runtime: %w", err)
	}
	e.rt = rt
	e.cleanProcWork()
	return rt, nil
}

// containerRunning reports whether the sandbox's container exists and runs
// (or is paused). It needs no runtime when no container was ever started,
// and spawns nothing. A container left frozen by a turnsnap that died is
// resumed here (recoverFreeze), so every command on the sandbox heals it.
func (e *Engine) containerRunning(ctx context.Context, sandbox string) (bool, error) {
	id := e.home.containerID(sandbox)
	if _, err := os.Stat(filepath.Join(e.home.procStateRoot(), "runc", id)); err != nil {
		return false, nil
	}
	rt, err := e.runtime(ctx)
	if err != nil {
		return false, err
	}
	st, err := rt.Status(id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("sandbox %s: %w", sandbox, err)
	}
	if st == proc.Paused || st == proc.Running {
		// Paused by a turnsnap that is gone, or about to be frozen again by
		// its CRIU (recoverFreeze tells them from a live checkpoint's).
		if _, err := e.recoverFreeze(ctx, sandbox); err != nil {
			return false, err
		}
	}
	return st == proc.Running || st == proc.Paused, nil
}

// ExecOptions configures Exec.
type ExecOptions struct {
	Detach bool `json:"detach,omitempty"` // start a long-lived process and return at once
	// Log is an absolute path inside the sandbox that receives a detached
	// process's stdout and stderr (appended; its directory must exist);
	// empty means /dev/null.
	Log    string    `json:"log,omitempty"`
	Stdin  io.Reader `json:"-"`
	Stdout io.Writer `json:"-"`
	Stderr io.Writer `json:"-"`
}

// CommandError is a command that cannot run in the sandbox: Code 127 when
// it is not found, 126 when it is not executable (a shell's codes).
type CommandError = proc.CommandError

// Exec runs argv inside the sandbox's container, starting the container
// on first use. It returns the command's exit code, or for Detach the
// process's pid inside the sandbox. A command that cannot run is a
// *CommandError.
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
	// The preparation (finishing an interrupted rollback, starting the
	// container) is an operation on the sandbox like any other; the
	// command itself runs outside the lock.
	done, err := e.op(ctx, name)
	if err != nil {
		return nil, err
	}
	defer done()
	st, err := e.loadSandbox(ctx, name)
	if err != nil {
		return nil, err
	}
	if lost := st.interrupted; lost != nil && lost.ProcessesLost != "" {
		e.log.Warn("the sandbox's processes were not restored", "sandbox", name, "why", lost.ProcessesLost)
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
	id := e.home.containerID(name)
	if running {
		if fs, err := rt.Freeze(id); err == nil && fs.Frozen {
			return nil, fmt.Errorf("sandbox %s: its container is frozen by %s (a checkpoint in progress?); wait, or thaw it with `turnsnap sandbox resume %s`: %w",
				name, freezeHolder(fs), name, errdefs.ErrPrecondition)
		}
	}
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
		if opts.Log != "" && (!filepath.IsAbs(opts.Log) || filepath.Clean(opts.Log) != opts.Log || strings.ContainsRune(opts.Log, 0)) {
			return 0, fmt.Errorf("sandbox %s: --log %q: want a clean absolute path inside the sandbox: %w", name, opts.Log, errdefs.ErrInvalid)
		}
		defer e.watchFreeze(ctx, name, rt)() // no exec waits on a freeze nobody holds
		run := func() (int, error) {
			if opts.Detach {
				return rt.ExecDetached(ctx, id, argv, proc.DetachOptions{Log: opts.Log})
			}
			in := opts.Stdin
			if in == nil {
				in = eofReader{}
			}
			return rt.Exec(ctx, id, argv, in, orDiscard(opts.Stdout), orDiscard(opts.Stderr))
		}
		code, err := run()
		if err != nil && strings.Contains(err.Error(), "paused") {
			// Frozen after the check above, before runc started the
			// command (runc refused it, nothing ran): by a freeze nobody
			// holds, thawed now, and the command is run once more.
			if thawed, rerr := e.recoverFreeze(ctx, name); rerr == nil && thawed {
				code, err = run()
			}
		}
		return code, nameCommandError(name, err)
	}, nil
}

// nameCommandError says which sandbox a command was not found in; the
// runtime's other errors name the container (ts-SCOPE-NAME) already.
func nameCommandError(sandbox string, err error) error {
	var ce *CommandError
	if errors.As(err, &ce) {
		return fmt.Errorf("sandbox %s: %w", sandbox, err)
	}
	return err
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
	if pt.cur, err = rt.Snapshot(ctx, e.home.containerID(name)); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	pt.changed, pt.reason = e.procsChanged(name, pt.cur, head)
	if pt.changed {
		return pt, e.pauseTurn(ctx, name, pt)
	}
	return pt, nil
}

func (e *Engine) procsChanged(name string, cur proc.ProcSet, head *delta.Checkpoint) (bool, string) {
	if !cur.NeedsImage() {
		return head.ProcTree != nil, "long-lived processes ended"
	}
	if head.ProcTree == nil {
		if len(cur.Procs) == 0 {
			return true, "files in the container's tmpfs (/dev, /dev/shm) not yet in any checkpoint"
		}
		return true, "processes not yet in any checkpoint"
	}
	return proc.Changed(e.loadBaseline(name), cur)
}

// pauseTurn freezes the container for the cut; pt.resume thaws it.
func (e *Engine) pauseTurn(ctx context.Context, name string, pt *procTurn) error {
	rt, _ := e.runtime(ctx)
	id := e.home.containerID(name)
	start := time.Now()
	if err := rt.Pause(ctx, id); err != nil {
		return fmt.Errorf("sandbox %s: pause for a consistent cut: %w", name, err)
	}
	e.phase(PhaseFreeze)
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
	cur, err := rt.Snapshot(ctx, e.home.containerID(name))
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
	dir, err := e.procWork("image")
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	meta, err := rt.Checkpoint(ctx, e.home.containerID(name), filepath.Join(dir, "img"), proc.DumpOptions{})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	e.phase(PhaseDump)
	return func() (delta.ID, json.RawMessage, error) {
		defer os.RemoveAll(dir)
		e.progressPhase("store process image", 0)
		e.phase(PhaseStore)
		res, err := fstree.Scan(ctx, filepath.Join(dir, "img"), fstree.ScanOptions{Saver: saver, IDs: e.ids(), Quiescent: true})
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
	set, err := rt.Baseline(ctx, e.home.containerID(name))
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
	if err := rt.Delete(ctx, e.home.containerID(name)); err != nil {
		return fmt.Errorf("sandbox %s: stop processes: %w", name, err)
	}
	os.Remove(e.home.baselineFile(name))
	os.Remove(e.home.restoredFile(name))
	return nil
}

// processImage materialises checkpoint cp's process image into a work
// directory, verifying every chunk, and returns it with a function that
// removes it. Rollback and branch call it before they touch the sandbox:
// an image that cannot be read must not cost the running processes.
func (e *Engine) processImage(ctx context.Context, cp *delta.Checkpoint) (string, func(), error) {
	dir, err := e.procWork("restore")
	if err != nil {
		return "", nil, fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
	}
	done := func() { os.RemoveAll(dir) }
	img := filepath.Join(dir, "img")
	if err := os.Mkdir(img, 0o700); err != nil {
		done()
		return "", nil, err
	}
	if _, err := fstree.Materialise(ctx, *cp.ProcTree, img, fstree.ApplyOptions{Loader: e.repo, IDs: e.ids(), Plain: true}); err != nil {
		done()
		return "", nil, fmt.Errorf("checkpoint %s: process image: %w", cp.ID.Short(), err)
	}
	return img, done, nil
}

// restoreProcesses brings a checkpoint's processes back in the sandbox's
// container, on its (already restored) root, from an image processImage
// prepared.
func (e *Engine) restoreProcesses(ctx context.Context, name, root, img string, cp *delta.Checkpoint) error {
	rt, err := e.runtime(ctx)
	if err != nil {
		return err
	}
	rt.Delete(ctx, e.home.containerID(name))
	if _, err := rt.Restore(ctx, e.home.containerID(name), root, img, proc.RestoreOptions{}); err != nil {
		return fmt.Errorf("sandbox %s: restore processes of %s: %w", name, cp.ID.Short(), err)
	}
	e.settle(ctx, name)
	return nil
}
