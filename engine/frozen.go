package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
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

// freeze keeps cp's layer frozen after its commit, from the sandbox's
// mounted root (verified chunk by chunk against cp's tree), sharing the
// files that did not change with the layer the root stacks on or with the
// parent's layer. It runs before the checkpoint call returns, so the next
// turn cannot race it into giving up; a failure costs only the
// accelerator (a branch of cp then materialises) and is logged.
func (e *Engine) freeze(ctx context.Context, st *sandboxState, cp *delta.Checkpoint) time.Duration {
	ob := e.overlayBackend()
	if ob == nil || st.sb.Backend != overlay.Name || e.frozenKeep() == 0 {
		return 0
	}
	start := time.Now()
	if ob.HasFrozen(cp.FSTree) {
		return 0 // a process-only turn's tree, or one frozen before
	}
	// What changed this turn is about what the layer gets copied: the home
	// must keep room for the catalog after it (room.go).
	if err := e.checkRoom(uint64(max(cp.Stats.BytesRead, 0))); err != nil {
		e.log.Warn("frozen layer not kept; branches of this checkpoint copy it", "sandbox", st.sb.Name, "checkpoint", cp.ID.Short(), "err", err)
		return time.Since(start)
	}
	var src *overlay.FreezeSource
	if dir := overlay.FrozenUser(e.home.sandboxDir(st.sb.Name)); dir != "" {
		if id, err := delta.ParseID(filepath.Base(dir)); err == nil {
			src = &overlay.FreezeSource{Tree: id}
		}
	} else if st.head != nil && ob.HasFrozen(st.head.FSTree) {
		src = &overlay.FreezeSource{Tree: st.head.FSTree}
	}
	stats, err := ob.Freeze(ctx, cp.FSTree, st.root.Path(), src, e.repo, func() { e.phase(PhaseFreezeLayer) })
	if err != nil {
		if !errors.Is(err, overlay.ErrNotFreezable) {
			e.log.Warn("frozen layer not kept; branches of this checkpoint copy it", "sandbox", st.sb.Name, "checkpoint", cp.ID.Short(), "err", err)
		}
		return time.Since(start)
	}
	e.log.Debug("frozen layer", "checkpoint", cp.ID.Short(), "linked", stats.Linked, "copied", stats.Copied, "from_store", stats.FromStore)
	if err := e.pruneFrozen(ctx, start); err != nil {
		e.log.Warn("frozen layers not pruned", "err", err)
	}
	return time.Since(start)
}

// pruneFrozen removes the frozen layers no retention rule keeps: not among
// the newest frozenKeep checkpoints of a live sandbox's line, and not
// stacked on by any root (asked again for each layer under the backend's
// lock). Layers made after notBefore are left to the next pass (a
// concurrent checkpoint's, which this pass's list may predate).
func (e *Engine) pruneFrozen(ctx context.Context, notBefore time.Time) error {
	ob := e.overlayBackend()
	if ob == nil {
		return nil
	}
	trees, err := ob.FrozenTrees()
	if err != nil || len(trees) == 0 {
		return err
	}
	keep := map[delta.ID]bool{}
	if n := e.frozenKeep(); n > 0 {
		err = e.view(ctx, func(tx *catalog.Tx) error {
			sbs, err := tx.Sandboxes()
			if err != nil {
				return err
			}
			for _, sb := range sbs {
				head, err := tx.GetRef(delta.RefHead, sb.Name)
				if err != nil {
					continue
				}
				line, err := tx.Ancestors(head, n)
				if err != nil && len(line) == 0 {
					continue
				}
				for _, cp := range line {
					keep[cp.FSTree] = true
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
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

// branchRoot makes a branch's root of cp in dir: stacked on cp's frozen
// layer when this host keeps it (no file copied), else materialised from
// the store.
func (e *Engine) branchRoot(ctx context.Context, be rootfs.Backend, dir, lower string, cp *delta.Checkpoint, materialise bool) (rootfs.Root, error) {
	if ob, ok := be.(*overlay.Backend); ok && !materialise && e.frozenKeep() > 0 && ob.HasFrozen(cp.FSTree) {
		r, err := ob.CreateStacked(ctx, dir, lower, cp.FSTree, cp.StateKey)
		if !errors.Is(err, errdefs.ErrNotFound) {
			return r, err
		}
		// Pruned between the look and the stack: copy it after all.
	}
	return be.Create(ctx, dir, lower, cp.FSTree, e.repo)
}
