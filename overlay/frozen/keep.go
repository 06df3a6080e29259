package frozen

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/turnsnap/turnsnap/delta"
)

// The frozen layers' policy (docs/STORAGE.md, "Frozen layers"): after
// each overlay checkpoint the Keeper keeps its layer read-only on this
// host, so that a branch of it stacks on the layer instead of copying it.
// Which layers stay is DefaultKeep (the engine's Config.FrozenKeep): the
// newest checkpoints on each live sandbox's line, plus any layer a root
// stacks on.

// PhaseLayer is reached when a committed checkpoint's frozen layer is
// built and about to be published (Deps.Phase).
const PhaseLayer = "freeze-layer"

// DefaultKeep is how many of each sandbox's newest checkpoints (its
// head and the head's ancestors) keep a frozen layer: the head (what a
// fan-out branches) and its parent (what a retry after a failed turn
// branches). Unchanged files are hardlinks between layers, so each costs
// its inodes and the bytes that changed.
const DefaultKeep = 2

// Keeper is a host's frozen-layer policy: it queues and runs the
// background freezes, builds a layer a branch needs now, and removes the
// layers no retention rule keeps. It owns the freezes' lifetime: Close
// cancels them and waits for them.
type Keeper struct {
	d       Deps
	ctx     context.Context // the freezes': Close cancels it
	cancel  context.CancelFunc
	freezes freezeJobs
	lines   lineMemo // retention's lines by head
}

// Deps is what a Keeper needs of the engine and of the overlay backend.
type Deps struct {
	Layers *Layers
	Log    *slog.Logger
	// Keep is the home's retention setting (read each time): how many of
	// each sandbox's newest checkpoints keep a layer; 0 turns freezing off.
	Keep func() int
	// OnBranch: after a checkpoint, a layer is made only from a layer this
	// host keeps; others wait for a branch that wants them (the engine's
	// Options.FreezeOnBranch).
	OnBranch bool
	// Loader is the store the layers' trees and chunks are read from (the
	// engine's repository, which it may replace: hence a function).
	Loader func() delta.BlobLoader
	// View runs fn on one consistent read of the catalog.
	View func(ctx context.Context, fn func(Lines) error) error
	// Room fails when writing need bytes would leave the home too little
	// room (for its catalog).
	Room func(need uint64) error
	// Phase reports reaching a named step (tests stop the process there).
	Phase func(name string)
	// Shared holds the engine's shared lock until release: maintenance
	// (gc, prune) waits for a running freeze.
	Shared func() (release func())
	// Yield returns when background work may go on (urgent checkpoints
	// first).
	Yield func(ctx context.Context)
	// Sandboxes is the directory holding each sandbox's root directory,
	// by name.
	Sandboxes string
	// LiveUpper and StackedOn read the generations of the root kept in a
	// sandbox's directory (package overlay's LiveUpper and FrozenUser).
	LiveUpper func(dir string) (string, error)
	StackedOn func(dir string) string
}

// Lines is what the policy reads of the catalog (a *catalog.Tx): the
// sandboxes, their heads, and checkpoints' lines.
type Lines interface {
	SandboxNames() ([]delta.SandboxName, error)
	GetRef(kind delta.RefKind, name string) (delta.ID, error)
	Ancestors(id delta.ID, limit int) ([]*delta.Checkpoint, error)
	Checkpoint(id delta.ID) (*delta.Checkpoint, error)
}

// NewKeeper returns the policy over d.Layers. Its background freezes run
// until Close.
func NewKeeper(d Deps) *Keeper {
	if d.Log == nil {
		d.Log = slog.Default()
	}
	k := &Keeper{d: d}
	k.ctx, k.cancel = context.WithCancel(context.Background())
	return k
}

// Layers is the layers the policy keeps.
func (k *Keeper) Layers() *Layers { return k.d.Layers }

func (k *Keeper) phase(name string) {
	if k.d.Phase != nil {
		k.d.Phase(name)
	}
}

func (k *Keeper) sandboxDir(name string) string { return filepath.Join(k.d.Sandboxes, name) }

// keep is the home's retention setting; 0 turns freezing off.
func (k *Keeper) keep() int {
	if k.d.Keep == nil {
		return DefaultKeep
	}
	return max(k.d.Keep(), 0)
}

// freeze builds job j's layer, from the live upper the checkpoint was
// scanned from (verified chunk by chunk against its tree), sharing the
// files that did not change with the layer the root stacks on or with the
// parent's layer, and made from a layer no retention rule keeps any more
// when there is one (only the names that differ are touched). It runs in
// the background (jobs.go) or in a branch that needs the layer now;
// a failure costs only the accelerator (a branch of the checkpoint then
// materialises) and is logged.
//
// keep is retention's current set if the caller has just read it (nil: it
// is read here).
func (k *Keeper) freeze(ctx context.Context, j *freezeJob, keep map[delta.ID]bool) {
	ob := k.d.Layers
	cp := j.cp
	if ob.Has(cp.FSTree) {
		return // a process-only turn's tree, or one frozen before
	}
	k.phase(PhaseStart)
	start := time.Now()
	// What changed this turn is about what the layer gets copied: the home
	// must keep room for the catalog after it (Deps.Room).
	if err := k.d.Room(max(uint64(max(cp.Stats.BytesRead, 0)), j.room)); err != nil {
		k.d.Log.Warn("frozen layer not kept; branches of this checkpoint copy it", "sandbox", j.sandbox, "checkpoint", cp.ID.Short(), "err", err)
		return
	}
	src := &Source{InUse: k.InUse, Yield: func() { k.freezes.pause(j) },
		Tree: k.sourceLayer(j.sandbox, j.parent)}
	if reuse, err := k.reusableLayers(ctx, cp, start, keep); err != nil {
		k.d.Log.Debug("frozen layer built in full", "checkpoint", cp.ID.Short(), "err", err)
	} else {
		src.Reuse = reuse
	}
	stats, err := ob.Freeze(ctx, cp.FSTree, j.live, src, k.d.Loader(), func() { k.phase(PhaseLayer) })
	if err != nil {
		// A freeze Close cancelled is no failure: the layer is simply not
		// kept (its build was removed unpublished).
		if !errors.Is(err, ErrNotFreezable) && !errors.Is(err, context.Canceled) {
			k.d.Log.Warn("frozen layer not kept; branches of this checkpoint copy it", "sandbox", j.sandbox, "checkpoint", cp.ID.Short(), "err", err)
		}
		return
	}
	k.d.Log.Debug("frozen layer", "checkpoint", cp.ID.Short(), "cloned", stats.Linked, "copied", stats.Copied,
		"from_store", stats.FromStore, "reused", !stats.Reused.IsZero(), "patched", stats.Patched, "ms", time.Since(start).Milliseconds())
}

// reusableLayers lists the frozen layers an incremental freeze of cp may
// be made from: kept by no retention rule (so the retention pass would
// remove them now), older than notAfter (a layer just published may be
// about to be stacked on), those of cp's own line first (closest to its
// tree, so the fewest names differ). Only these: another sandbox's layer
// may differ in everything. keep is retention's set, nil to read it here.
func (k *Keeper) reusableLayers(ctx context.Context, cp *delta.Checkpoint, notAfter time.Time, keep map[delta.ID]bool) ([]delta.ID, error) {
	ob := k.d.Layers
	trees, err := ob.Trees()
	if err != nil || len(trees) == 0 {
		return nil, err
	}
	if keep == nil {
		if keep, err = k.KeepSet(ctx); err != nil {
			return nil, err
		}
	}
	have := map[delta.ID]bool{}
	for _, t := range trees {
		if fi, err := os.Stat(ob.Dir(t)); err == nil && fi.ModTime().Before(notAfter) && !keep[t] {
			have[t] = true
		}
	}
	var out []delta.ID
	err = k.d.View(ctx, func(tx Lines) error {
		line, err := tx.Ancestors(cp.ID, reuseLine)
		if err != nil && len(line) == 0 {
			return err
		}
		for _, a := range line {
			if have[a.FSTree] {
				out = append(out, a.FSTree)
				delete(have, a.FSTree)
			}
		}
		return nil
	})
	return out, err
}

// reuseLine is how far back on a checkpoint's line an incremental freeze
// looks for a layer to make it from.
const reuseLine = 8

// KeepSet is the trees retention keeps frozen: those of the newest
// keep() checkpoints on each live sandbox's line.
func (k *Keeper) KeepSet(ctx context.Context) (map[delta.ID]bool, error) {
	keep := map[delta.ID]bool{}
	n := k.keep()
	if n == 0 {
		return keep, nil
	}
	err := k.d.View(ctx, func(tx Lines) error {
		names, err := tx.SandboxNames()
		if err != nil {
			return err
		}
		for _, name := range names {
			head, err := tx.GetRef(delta.RefHead, string(name))
			if err != nil {
				continue
			}
			trees, ok := k.lines.get(head, n)
			if !ok {
				line, err := tx.Ancestors(head, n)
				if err != nil && len(line) == 0 {
					continue
				}
				trees = make([]delta.ID, len(line))
				for i, cp := range line {
					trees[i] = cp.FSTree
				}
				if err == nil {
					k.lines.put(head, n, trees)
				}
			}
			for _, t := range trees {
				keep[t] = true
			}
		}
		return nil
	})
	return keep, err
}

// lineMemo remembers, by head checkpoint, the fs trees of the head and its
// ancestors that retention keeps: a checkpoint's line never changes (each
// record names its parent and is named by its hash), so a retention pass
// decodes only the records of heads that moved since the last one. It ran
// after every freeze and decoded every sandbox's newest records: 12% of
// the daemon's CPU in BenchmarkConcurrentTurns' saturated phase.
type lineMemo struct {
	mu    sync.Mutex
	lines map[lineKey][]delta.ID
}

type lineKey struct {
	head delta.ID
	n    int
}

// lineMemoMax bounds the memo; past it, it starts again (a pass then
// decodes each live head's line once more).
const lineMemoMax = 4096

func (m *lineMemo) get(head delta.ID, n int) ([]delta.ID, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.lines[lineKey{head, n}]
	return t, ok
}

func (m *lineMemo) put(head delta.ID, n int, trees []delta.ID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lines == nil || len(m.lines) >= lineMemoMax {
		m.lines = map[lineKey][]delta.ID{}
	}
	m.lines[lineKey{head, n}] = trees
}

// prune removes the frozen layers no retention rule keeps: not among
// the newest keep() checkpoints of a live sandbox's line, and not
// stacked on by any root (asked again for each layer under the backend's
// lock). Layers made after notBefore are left to the next pass (a
// concurrent checkpoint's, which this pass's list may predate), and so are
// those a pending freeze will build. It also sweeps what a killed process
// left.
func (k *Keeper) prune(ctx context.Context, notBefore time.Time) error {
	ob := k.d.Layers
	ob.Sweep()
	trees, err := ob.Trees()
	if err != nil || len(trees) == 0 {
		return err
	}
	keep, err := k.KeepSet(ctx)
	if err != nil {
		return err
	}
	for _, t := range trees {
		if keep[t] {
			continue
		}
		if fi, err := os.Stat(ob.Dir(t)); err == nil && !fi.ModTime().Before(notBefore) {
			continue
		}
		if _, err := ob.Remove(t, k.InUse); err != nil {
			return err
		}
	}
	return nil
}

// Prune runs the retention pass (after gc, prune and sandbox rm: layers
// their checkpoints or sandboxes kept are kept no longer).
func (k *Keeper) Prune(ctx context.Context) error { return k.prune(ctx, time.Now()) }

// InUse reports whether any sandbox root on this host stacks on the
// frozen layer dir.
func (k *Keeper) InUse(dir string) bool {
	ents, _ := os.ReadDir(k.d.Sandboxes)
	for _, ent := range ents {
		if k.d.StackedOn(k.sandboxDir(ent.Name())) == dir {
			return true
		}
	}
	return false
}
