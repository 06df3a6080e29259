package engine

import (
	"context"
	"errors"
	"io"
	"path"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/procs"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"github.com/turnsnap/turnsnap/proc"
)

// What a backend does beyond rootfs.Backend is behind the optional
// interfaces of internal/rootfs (frozen layers, change tracking, tracked
// rollbacks): the engine asks a sandbox's backend for each where it needs
// it, and does without where the backend has none (btrfs). The policy and
// its state are the backend's.

// TrackingStats counts what change tracking did, for the daemon's metrics.
type TrackingStats = rootfs.TrackingStats

// implementing returns the backends in bs that implement T.
func implementing[T any](bs map[string]rootfs.Backend) []T {
	var out []T
	for _, b := range bs {
		if t, ok := b.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// closeBackends stops the backends' background work (Engine.Close).
func closeBackends(bs map[string]rootfs.Backend) {
	for _, c := range implementing[io.Closer](bs) {
		c.Close()
	}
}

// turnStarted counts a checkpoint in flight, until done is called, for
// every backend whose background work waits for the turns.
func turnStarted(bs map[string]rootfs.Backend) (done func()) {
	var dones []func()
	for _, f := range implementing[rootfs.Freezer](bs) {
		dones = append(dones, f.TurnStarted())
	}
	return func() {
		for _, d := range dones {
			d()
		}
	}
}

// WaitFreezes waits until no background freeze is pending, the retention
// pass after each included (tools, benchmarks and tests).
func (e *Engine) WaitFreezes() {
	for _, f := range implementing[rootfs.Freezer](e.backends) {
		f.WaitFreezes()
	}
}

// dropFrozen runs the frozen layers' retention pass after gc, prune and
// sandbox rm: their own work is done by then, so a failure here is only
// logged.
func (e *Engine) dropFrozen(ctx context.Context) {
	for _, f := range implementing[rootfs.Freezer](e.backends) {
		if err := f.PruneFrozen(ctx); err != nil {
			e.log.Warn("frozen layers not pruned", "err", err)
		}
	}
}

// TrackingStats returns the change-tracking counters.
func (e *Engine) TrackingStats() TrackingStats {
	out := TrackingStats{Walks: map[string]uint64{}}
	for _, s := range implementing[rootfs.TurnScanner](e.backends) {
		st := s.TrackingStats()
		out.TrackedScans += st.TrackedScans
		out.UnchangedTurns += st.UnchangedTurns
		out.PathsScanned += st.PathsScanned
		out.Overflows += st.Overflows
		out.Events += st.Events
		out.StartFailures += st.StartFailures
		for k, v := range st.Walks {
			out.Walks[k] += v
		}
	}
	return out
}

// untrack stops tracking sandbox name's changes: before its root is
// unmounted (rollback, remove), and because the next turn after either
// must walk.
func (e *Engine) untrack(name string) {
	for _, s := range implementing[rootfs.TurnScanner](e.backends) {
		s.Untrack(name)
	}
}

// scanTurn scans sandbox name's root for a checkpoint: through its
// backend's change record when it keeps one (rootfs.TurnScanner), else by
// walking. The files its running processes map shared and writable are
// read again whatever their stat says.
func scanTurn(ctx context.Context, be rootfs.Backend, name string, st *sandboxState, pt *procs.Turn, saver delta.BlobSaver) (*fstree.ScanResult, rootfs.TurnScan, error) {
	if ts, ok := be.(rootfs.TurnScanner); ok {
		var shared []string
		if pt.Running {
			shared = sharedWritable(pt.Cur)
		}
		return ts.ScanTurn(ctx, name, st.root, shared, saver)
	}
	res, err := st.root.Scan(ctx, saver)
	return res, committedAtOnce{st.root}, err
}

// committedAtOnce settles the scan of a backend without change records.
type committedAtOnce struct{ root rootfs.Root }

func (s committedAtOnce) Committed(res *fstree.ScanResult) error { return s.root.Committed(res) }
func (committedAtOnce) Skipped(*fstree.ScanResult, delta.ID)     {}
func (committedAtOnce) Failed()                                  {}

// sharedWritable is the root-relative paths of the files ps maps shared
// and writable (a deleted file is no name of the root).
func sharedWritable(ps proc.ProcSet) []string {
	var out []string
	for _, p := range ps.SharedWritable() {
		if rel := strings.TrimPrefix(path.Clean(p), "/"); rel != "" && !strings.HasSuffix(p, " (deleted)") {
			out = append(out, rel)
		}
	}
	return out
}

// branchRoot makes a branch's root of cp in dir: stacked on cp's frozen
// layer when the backend keeps it or is freezing it (no file copied;
// rootfs.Freezer.PrepareBranch made it if it could), else created from
// loader.
func branchRoot(ctx context.Context, be rootfs.Backend, dir, lower string, cp *delta.Checkpoint, materialise bool, loader delta.BlobLoader) (rootfs.Root, error) {
	if f, ok := be.(rootfs.Freezer); ok && !materialise {
		r, err := f.StackBranch(ctx, dir, lower, cp)
		if !errors.Is(err, errdefs.ErrNotFound) {
			return r, err
		}
		// No layer, or pruned between the look and the stack: copy it.
	}
	return be.Create(ctx, dir, lower, cp.FSTree, loader)
}

// plainRollback restores a root of a backend without tracked rollbacks
// (rootfs.Rollbacker): Root.Restore, once beforeWrite has run.
type plainRollback struct {
	e    *Engine
	name string
	root rootfs.Root
}

func (p plainRollback) Restore(ctx context.Context, cp *delta.Checkpoint, loader delta.BlobLoader, beforeWrite func() error) (rootfs.RestoreInfo, error) {
	p.e.untrack(p.name)
	if err := beforeWrite(); err != nil {
		return rootfs.RestoreInfo{}, err
	}
	return rootfs.RestoreInfo{}, p.root.Restore(ctx, cp.FSTree, loader)
}

func (plainRollback) Abort() {}
