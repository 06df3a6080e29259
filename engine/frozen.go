package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/overlay"
)

// Frozen layers (docs/STORAGE.md, "Frozen layers"): after each overlay
// checkpoint the engine keeps its layer read-only on this host, so that a
// branch of it stacks on the layer instead of copying it. Which layers stay
// is DefaultFrozenKeep (Config.FrozenKeep): the newest checkpoints on each
// live sandbox's line, plus any layer a root stacks on.

// PhaseFreezeLayer is reached when a committed checkpoint's frozen layer
// is built and about to be published (Options.AtPhase).
const PhaseFreezeLayer = "freeze-layer"

// DefaultFrozenKeep is how many of each sandbox's newest checkpoints (its
// head and the head's ancestors) keep a frozen layer: the head (what a
// fan-out branches) and its parent (what a retry after a failed turn
// branches). Unchanged files are hardlinks between layers, so each costs
// its inodes and the bytes that changed.
const DefaultFrozenKeep = 2

// frozenKeep is the home's retention setting; 0 turns freezing off.
func (e *Engine) frozenKeep() int {
	if e.config.FrozenKeep == nil {
		return DefaultFrozenKeep
	}
	return max(*e.config.FrozenKeep, 0)
}

func (e *Engine) overlayBackend() *overlay.Backend {
	ob, _ := e.backends[overlay.Name].(*overlay.Backend)
	return ob
}

// freeze builds job j's layer, from the live upper the checkpoint was
// scanned from (verified chunk by chunk against its tree), sharing the
// files that did not change with the layer the root stacks on or with the
// parent's layer, and made from a layer no retention rule keeps any more
// when there is one (only the names that differ are touched). It runs in
// the background (frozen_bg.go) or in a branch that needs the layer now;
// a failure costs only the accelerator (a branch of the checkpoint then
// materialises) and is logged.
//
// keep is retention's current set if the caller has just read it (nil: it
// is read here).
func (e *Engine) freeze(ctx context.Context, j *freezeJob, keep map[delta.ID]bool) {
	ob := e.overlayBackend()
	cp := j.cp
	if ob == nil || ob.HasFrozen(cp.FSTree) {
		return // a process-only turn's tree, or one frozen before
	}
	e.phase(PhaseFreezeStart)
	start := time.Now()
	// What changed this turn is about what the layer gets copied: the home
	// must keep room for the catalog after it (room.go).
	if err := e.checkRoom(max(uint64(max(cp.Stats.BytesRead, 0)), j.room), 0); err != nil {
		e.log.Warn("frozen layer not kept; branches of this checkpoint copy it", "sandbox", j.sandbox, "checkpoint", cp.ID.Short(), "err", err)
		return
	}
	src := &overlay.FreezeSource{InUse: e.frozenInUse, Yield: func() { e.freezes.pause(j) },
		Tree: e.sourceLayer(ob, j.sandbox, j.parent)}
	if reuse, err := e.reusableLayers(ctx, cp, start, keep); err != nil {
		e.log.Debug("frozen layer built in full", "checkpoint", cp.ID.Short(), "err", err)
	} else {
		src.Reuse = reuse
	}
	stats, err := ob.Freeze(ctx, cp.FSTree, j.live, src, e.repo, func() { e.phase(PhaseFreezeLayer) })
	if err != nil {
		if !errors.Is(err, overlay.ErrNotFreezable) {
			e.log.Warn("frozen layer not kept; branches of this checkpoint copy it", "sandbox", j.sandbox, "checkpoint", cp.ID.Short(), "err", err)
		}
		return
	}
	e.log.Debug("frozen layer", "checkpoint", cp.ID.Short(), "cloned", stats.Linked, "copied", stats.Copied,
		"from_store", stats.FromStore, "reused", !stats.Reused.IsZero(), "patched", stats.Patched, "ms", time.Since(start).Milliseconds())
}

// reusableLayers lists the frozen layers an incremental freeze of cp may
// be made from: kept by no retention rule (so the retention pass would
// remove them now), older than notAfter (a layer just published may be
// about to be stacked on), those of cp's own line first (closest to its
// tree, so the fewest names differ). Only these: another sandbox's layer
// may differ in everything. keep is retention's set, nil to read it here.
func (e *Engine) reusableLayers(ctx context.Context, cp *delta.Checkpoint, notAfter time.Time, keep map[delta.ID]bool) ([]delta.ID, error) {
	ob := e.overlayBackend()
	trees, err := ob.FrozenTrees()
	if err != nil || len(trees) == 0 {
		return nil, err
	}
	if keep == nil {
		if keep, err = e.frozenKeepSet(ctx); err != nil {
			return nil, err
		}
	}
	have := map[delta.ID]bool{}
	for _, t := range trees {
		if fi, err := os.Stat(ob.FrozenDir(t)); err == nil && fi.ModTime().Before(notAfter) && !keep[t] {
			have[t] = true
		}
	}
	var out []delta.ID
	err = e.view(ctx, func(tx *catalog.Tx) error {
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

// frozenKeepSet is the trees retention keeps frozen: those of the newest
// frozenKeep checkpoints on each live sandbox's line.
func (e *Engine) frozenKeepSet(ctx context.Context) (map[delta.ID]bool, error) {
	keep := map[delta.ID]bool{}
	n := e.frozenKeep()
	if n == 0 {
		return keep, nil
	}
	err := e.view(ctx, func(tx *catalog.Tx) error {
		names, err := tx.SandboxNames()
		if err != nil {
			return err
		}
		for _, name := range names {
			head, err := tx.GetRef(delta.RefHead, name)
			if err != nil {
				continue
			}
			trees, ok := e.keepLines.get(head, n)
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
					e.keepLines.put(head, n, trees)
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

// pruneFrozen removes the frozen layers no retention rule keeps: not among
// the newest frozenKeep checkpoints of a live sandbox's line, and not
// stacked on by any root (asked again for each layer under the backend's
// lock). Layers made after notBefore are left to the next pass (a
// concurrent checkpoint's, which this pass's list may predate), and so are
// those a pending freeze will build. It also sweeps what a killed process
// left.
func (e *Engine) pruneFrozen(ctx context.Context, notBefore time.Time) error {
	ob := e.overlayBackend()
	if ob == nil {
		return nil
	}
	ob.SweepFrozen()
	trees, err := ob.FrozenTrees()
	if err != nil || len(trees) == 0 {
		return err
	}
	keep, err := e.frozenKeepSet(ctx)
	if err != nil {
		return err
	}
	for _, t := range trees {
		if keep[t] {
			continue
		}
		if fi, err := os.Stat(ob.FrozenDir(t)); err == nil && !fi.ModTime().Before(notBefore) {
			continue
		}
		if _, err := ob.RemoveFrozen(t, e.frozenInUse); err != nil {
			return err
		}
	}
	return nil
}

// dropFrozen runs the retention pass after gc, prune and sandbox rm: their
// own work is done by then, so a failure here is only logged.
func (e *Engine) dropFrozen(ctx context.Context) {
	if err := e.pruneFrozen(ctx, time.Now()); err != nil {
		e.log.Warn("frozen layers not pruned", "err", err)
	}
}

// frozenInUse reports whether any sandbox root on this host stacks on the
// frozen layer dir.
func (e *Engine) frozenInUse(dir string) bool {
	ents, _ := os.ReadDir(filepath.Join(string(e.home), "sandboxes"))
	for _, ent := range ents {
		if overlay.FrozenUser(e.home.sandboxDir(ent.Name())) == dir {
			return true
		}
	}
	return false
}
