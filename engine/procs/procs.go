package procs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/proc"
	"github.com/turnsnap/turnsnap/proc/criu"
)

// Sandbox processes. Each sandbox can run one container (runc, its root as
// rootfs), started by the first Exec. At a turn boundary the engine compares
// the container's long-lived processes with the baseline taken after the
// last process checkpoint (proc.Changed); a change is dumped with CRIU while
// the container is paused for the filesystem scan, so both halves of a
// checkpoint are one instant. The image directory is stored like any
// directory: chunked, deduplicated, packed, a tree (the record's proc_tree).

// Scope names the home on this host: a short hash of its path. It goes
// into container ids and, through the runtime's state root, cgroup paths,
// so two homes with a sandbox of the same name never share a container, a
// cgroup or a freeze.
func (m *Manager) Scope() string {
	sum := sha256.Sum256([]byte(m.home))
	return hex.EncodeToString(sum[:6])
}

// ContainerID is the runc id of a sandbox's container: ts-SCOPE-NAME.
func (m *Manager) ContainerID(sandbox string) string { return "ts-" + m.Scope() + "-" + sandbox }

// Container is a sandbox's container as an operation holds it: the
// sandbox's name and its runc id, computed once (Manager.Container) rather
// than at every call.
type Container struct {
	Sandbox delta.SandboxName
	ID      string
}

// Container is the container of sandbox (ContainerID).
func (m *Manager) Container(sandbox delta.SandboxName) Container {
	return Container{Sandbox: sandbox, ID: m.ContainerID(string(sandbox))}
}

// StateRoot keeps runc's state on tmpfs (it does not survive a reboot
// anyway), one directory per home so homes never see each other's
// containers.
func (m *Manager) StateRoot() string { return filepath.Join("/run/turnsnap", m.Scope()) }

// Dir holds the home's process bookkeeping: baselines, the cached host
// probe, and work/ for process images on their way to or from the store
// (process memory, so secrets: 0700, and leftovers of a killed turnsnap are
// removed by the next command, see CleanWork).
func (m *Manager) Dir() string { return filepath.Join(m.home, "proc") }

// WorkDir is where process images are on their way to or from the store.
func (m *Manager) WorkDir() string { return filepath.Join(m.Dir(), "work") }

func (m *Manager) baselineFile(sandbox delta.SandboxName) string {
	return filepath.Join(m.Dir(), string(sandbox)+".baseline.json")
}

// RestoredFile is the engine's note of the state a process restore left
// on the sandbox's root (engine/receipt/restored.go): it lives with the
// processes, and Stop removes it with them.
func (m *Manager) RestoredFile(sandbox string) string {
	return filepath.Join(m.Dir(), sandbox+".restored")
}

// Runtime returns the process runtime, made on first use: sandboxes that
// never run processes never need runc or CRIU. The host probe is cached in
// the home (proc.Config.ProbeCache), so a turn pays for it only after runc,
// CRIU or the kernel changed.
func (m *Manager) Runtime(ctx context.Context) (*proc.Runtime, error) {
	m.rtMu.Lock()
	defer m.rtMu.Unlock()
	if m.rt != nil {
		return m.rt, nil
	}
	if err := ensurePrivateDir(m.WorkDir()); err != nil {
		return nil, fmt.Errorf("home %s: %w", m.home, err)
	}
	rt, err := proc.New(ctx, proc.Config{StateRoot: m.StateRoot(), CRIU: m.d.CRIU, Logger: m.d.Log,
		ProbeCache: filepath.Join(m.Dir(), "host-probe.json")})
	if err != nil {
		return nil, fmt.Errorf("process runtime: %w", err)
	}
	m.rt = rt
	m.CleanWork()
	return rt, nil
}

// Running reports whether the sandbox's container exists and runs (or is
// paused). It needs no runtime when no container was ever started,
// and spawns nothing. A container left frozen by a turnsnap that died is
// resumed here (recoverFreeze), so every command on the sandbox heals it.
func (m *Manager) Running(ctx context.Context, c Container) (bool, error) {
	sandbox := c.Sandbox
	id := c.ID
	if _, err := os.Stat(filepath.Join(m.StateRoot(), "runc", id)); err != nil {
		return false, nil
	}
	rt, err := m.Runtime(ctx)
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
		if _, err := m.recoverFreeze(ctx, sandbox); err != nil {
			return false, err
		}
	}
	return st == proc.Running || st == proc.Paused, nil
}

// Snapshot lists the long-lived processes of the sandbox's container,
// which must run (Running).
func (m *Manager) Snapshot(ctx context.Context, c Container) (proc.ProcSet, error) {
	rt, err := m.Runtime(ctx)
	if err != nil {
		return proc.ProcSet{}, err
	}
	return rt.Snapshot(ctx, c.ID)
}

// Inventory is the sandbox's running container as a restore's receipt
// compares it with the image it was restored from.
func (m *Manager) Inventory(ctx context.Context, name string) (proc.Inventory, error) {
	rt, err := m.Runtime(ctx)
	if err != nil {
		return proc.Inventory{}, err
	}
	return rt.Inventory(ctx, m.ContainerID(name))
}

// Turn is the process half of a turn boundary, prepared before the
// filesystem scan: whether processes changed, with the container paused
// (Resume must be called) when one runs.
type Turn struct {
	Running bool // the container runs
	Changed bool // the processes changed since the last process checkpoint
	Reason  string
	Cur     proc.ProcSet // the container's processes (when Running)
	resume  func()
	Paused  time.Duration // how long the cut kept the processes frozen (set by Resume)
}

// Resume thaws the container a changed turn paused; it is a no-op
// otherwise. The caller calls it once.
func (pt *Turn) Resume() { pt.resume() }

// BeginTurn snapshots the container's processes and decides whether
// they changed since the last process checkpoint. Changed processes are
// paused at once, so the scan and the dump are one instant. Unchanged ones
// are left running: freezing would itself look like activity next turn,
// and ConfirmIdle checks after the scan that they stayed idle throughout.
func (m *Manager) BeginTurn(ctx context.Context, c Container, head *delta.Checkpoint) (*Turn, error) {
	name := c.Sandbox
	pt := &Turn{resume: func() {}}
	running, err := m.Running(ctx, c)
	if err != nil {
		return nil, err
	}
	if !running {
		// No processes now: a change only if the last checkpoint had some.
		pt.Changed = head.ProcTree != nil
		pt.Reason = "long-lived processes ended"
		return pt, nil
	}
	rt, _ := m.Runtime(ctx)
	pt.Running = true
	if pt.Cur, err = rt.Snapshot(ctx, c.ID); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	pt.Changed, pt.Reason = m.changed(name, pt.Cur, head)
	if pt.Changed {
		return pt, m.pause(ctx, c, pt)
	}
	return pt, nil
}

func (m *Manager) changed(name delta.SandboxName, cur proc.ProcSet, head *delta.Checkpoint) (bool, string) {
	if !cur.NeedsImage() {
		return head.ProcTree != nil, "long-lived processes ended"
	}
	if head.ProcTree == nil {
		if len(cur.Procs) == 0 {
			return true, "files in the container's tmpfs (/dev, /dev/shm) not yet in any checkpoint"
		}
		return true, "processes not yet in any checkpoint"
	}
	return proc.Changed(m.baseline(name), cur)
}

// pause freezes the container for the cut; pt.Resume thaws it.
func (m *Manager) pause(ctx context.Context, c Container, pt *Turn) error {
	name := c.Sandbox
	rt, _ := m.Runtime(ctx)
	id := c.ID
	start := time.Now()
	if err := rt.Pause(ctx, id); err != nil {
		return fmt.Errorf("sandbox %s: pause for a consistent cut: %w", name, err)
	}
	m.phase(PhaseFreeze)
	pt.resume = func() {
		if err := rt.Resume(context.WithoutCancel(ctx), id); err != nil {
			m.d.Log.Error("resume after checkpoint failed", "sandbox", name, "err", err)
		}
		pt.Paused = time.Since(start)
	}
	return nil
}

// ConfirmIdle is called after the scan of a turn whose processes were
// unchanged and left running. If they did anything meanwhile, the files just
// scanned may be theirs mid-change: it pauses them and reports that the turn
// must rescan and dump (the cut is then taken properly).
func (m *Manager) ConfirmIdle(ctx context.Context, c Container, pt *Turn, head *delta.Checkpoint) (bool, error) {
	name := c.Sandbox
	if !pt.Running || pt.Changed {
		return false, nil
	}
	rt, _ := m.Runtime(ctx)
	cur, err := rt.Snapshot(ctx, c.ID)
	if err != nil {
		return false, fmt.Errorf("sandbox %s: %w", name, err)
	}
	if changed, reason := m.changed(name, cur, head); changed {
		pt.Cur, pt.Changed, pt.Reason = cur, true, reason+" (during the scan)"
		return true, m.pause(ctx, c, pt)
	}
	return false, nil
}

// Dump captures the paused container into an image directory (the
// container stays paused) and returns a function that stores the image and
// removes the directory. The image is a finished snapshot once CRIU
// returns, so the caller resumes the container before storing it: chunking
// and compressing a 200 MB image takes about a second that the sandbox's
// processes should not spend frozen.
//
// It also returns CRIU's own statistics of the dump (nil when CRIU wrote
// none), which the record carries with the image.
func (m *Manager) Dump(ctx context.Context, c Container, saver delta.BlobSaver) (store func() (delta.ID, json.RawMessage, error), dump *delta.DumpStats, err error) {
	name := c.Sandbox
	rt, _ := m.Runtime(ctx)
	dir, err := m.work("image")
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	meta, err := rt.Checkpoint(ctx, c.ID, filepath.Join(dir, "img"), proc.DumpOptions{})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	m.phase(PhaseDump)
	return func() (delta.ID, json.RawMessage, error) {
		defer os.RemoveAll(dir)
		m.progress("store process image", 0)
		m.phase(PhaseStore)
		res, err := fstree.Scan(ctx, filepath.Join(dir, "img"), fstree.ScanOptions{Saver: phaseSaver{saver, m.phase}, IDs: m.d.IDs(), Quiescent: true})
		if err != nil {
			return delta.ID{}, nil, fmt.Errorf("sandbox %s: store process image: %w", name, err)
		}
		host, err := json.Marshal(meta.Host)
		return res.Root, host, err
	}, DumpStatsOf(meta.CRIU), nil
}

// DumpStatsOf is CRIU's statistics of a dump as a record carries them
// (delta.DumpStats), nil for none. Times beyond the record's bound are
// clamped to it: CRIU counts them in 32-bit microseconds, well below it.
func DumpStatsOf(s *criu.DumpStats) *delta.DumpStats {
	if s == nil {
		return nil
	}
	ns := func(d time.Duration) int64 { return min(max(d.Nanoseconds(), 0), delta.MaxDumpNs) }
	return &delta.DumpStats{FreezingNs: ns(s.FreezingTime), FrozenNs: ns(s.FrozenTime), MemdumpNs: ns(s.MemdumpTime),
		MemwriteNs: ns(s.MemwriteTime), PagesScanned: s.PagesScanned, PagesWritten: s.PagesWritten,
		PagesSkippedParent: s.PagesSkippedParent}
}

// Settle records the baseline the next turn compares against.
func (m *Manager) Settle(ctx context.Context, c Container) {
	name := c.Sandbox
	rt, err := m.Runtime(ctx)
	if err != nil {
		return
	}
	set, err := rt.Baseline(ctx, c.ID)
	if err != nil {
		m.d.Log.Warn("process baseline", "sandbox", name, "err", err)
		return
	}
	data, _ := json.Marshal(set)
	p := m.baselineFile(name)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err == nil {
		os.WriteFile(p, data, 0o600)
	}
}

func (m *Manager) baseline(name delta.SandboxName) proc.ProcSet {
	var set proc.ProcSet
	if data, err := os.ReadFile(m.baselineFile(name)); err == nil {
		json.Unmarshal(data, &set)
	}
	return set
}

// CheckHost refuses a process restore the recorded host facts rule out.
func (m *Manager) CheckHost(ctx context.Context, cp *delta.Checkpoint) error {
	if cp.ProcTree == nil {
		return nil
	}
	var rec proc.HostFacts
	if err := json.Unmarshal(cp.Host, &rec); err != nil {
		return fmt.Errorf("checkpoint %s: host facts: %v: %w", cp.ID.Short(), err, errdefs.ErrCorrupt)
	}
	rt, err := m.Runtime(ctx)
	if err != nil {
		return fmt.Errorf("checkpoint %s has processes but this host cannot run them (%v); restore its files only with --fs-only: %w",
			cp.ID.Short(), err, errdefs.ErrPrecondition)
	}
	if err := proc.CheckRestore(rec, rt.Host()); err != nil {
		return fmt.Errorf("checkpoint %s: %w (use --fs-only to restore its files without its processes)", cp.ID.Short(), err)
	}
	return nil
}

// Stop ends the sandbox's container, if any: a root is replaced
// only with nothing running on it.
func (m *Manager) Stop(ctx context.Context, c Container) error {
	name := c.Sandbox
	running, err := m.Running(ctx, c)
	if err != nil {
		return err
	}
	if !running {
		// A container that stopped, or the state a runc killed mid-restore
		// left (proc's deadstate.go), still has its state, network
		// namespace and bundle: removed with it.
		if _, err := os.Stat(filepath.Join(m.StateRoot(), "runc", c.ID)); err != nil {
			return nil
		}
	}
	rt, err := m.Runtime(ctx)
	if err != nil {
		return err
	}
	if err := rt.Delete(ctx, c.ID); err != nil {
		return fmt.Errorf("sandbox %s: stop processes: %w", name, err)
	}
	os.Remove(m.baselineFile(name))
	os.Remove(m.RestoredFile(string(name)))
	return nil
}

// Image materialises checkpoint cp's process image into a work
// directory, verifying every chunk, and returns it with a function that
// removes it. Rollback and branch call it before they touch the sandbox:
// an image that cannot be read must not cost the running processes.
func (m *Manager) Image(ctx context.Context, cp *delta.Checkpoint) (string, func(), error) {
	dir, err := m.work("restore")
	if err != nil {
		return "", nil, fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
	}
	done := func() { os.RemoveAll(dir) }
	img := filepath.Join(dir, "img")
	if err := os.Mkdir(img, 0o700); err != nil {
		done()
		return "", nil, err
	}
	if _, err := fstree.Materialise(ctx, *cp.ProcTree, img, fstree.ApplyOptions{Loader: m.d.Loader(), IDs: m.d.IDs(), Plain: true}); err != nil {
		done()
		return "", nil, fmt.Errorf("checkpoint %s: process image: %w", cp.ID.Short(), err)
	}
	return img, done, nil
}

// Restore brings a checkpoint's processes back in the sandbox's
// container c, on its (already restored) root, from an image Image
// prepared.
func (m *Manager) Restore(ctx context.Context, c Container, root, img string, cp *delta.Checkpoint) error {
	rt, err := m.Runtime(ctx)
	if err != nil {
		return err
	}
	rt.Delete(ctx, c.ID)
	if _, err := rt.Restore(ctx, c.ID, root, img, proc.RestoreOptions{}); err != nil {
		return fmt.Errorf("sandbox %s: restore processes of %s: %w", c.Sandbox, cp.ID.Short(), err)
	}
	m.Settle(ctx, c)
	return nil
}

// phaseSaver reports PhaseImageBlob for every blob of a process image it
// passes on to the store.
type phaseSaver struct {
	next  delta.BlobSaver
	phase func(string)
}

func (s phaseSaver) SaveBlob(ctx context.Context, t delta.BlobType, id delta.ID, plaintext []byte) (bool, error) {
	s.phase(PhaseImageBlob)
	return s.next.SaveBlob(ctx, t, id, plaintext)
}
