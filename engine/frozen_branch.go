package engine

import (
	"context"
	"errors"
	"path/filepath"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"github.com/turnsnap/turnsnap/overlay"
)

// Frozen layers for branches (docs/ARCHITECTURE.md, "Frozen layers"): a
// branch on overlay stacks on its checkpoint's layer, built for it when
// this host has none; with Options.FreezeOnBranch (the CLI's direct mode)
// that is how a sandbox's first layer is made.

// sourceLayer is the kept layer a freeze of sandbox's next layer is made
// from (linking the files that did not change): the one its root stacks
// on, else its parent checkpoint's tree's (zero: none, a build from
// nothing). With Options.FreezeOnBranch only freezes with a source run
// after a checkpoint, so a sandbox that was branched (or is a branch)
// keeps layers at the cost of its changes, and one never branched pays
// nothing.
func (e *Engine) sourceLayer(ob *overlay.Backend, sandbox string, parent delta.ID) delta.ID {
	if dir := overlay.FrozenUser(e.home.sandboxDir(sandbox)); dir != "" {
		if id, err := delta.ParseID(filepath.Base(dir)); err == nil && ob.HasFrozen(id) {
			return id
		}
	}
	if !parent.IsZero() && ob.HasFrozen(parent) {
		return parent
	}
	return delta.ID{}
}

// freezeForBranch makes sure cp's frozen layer exists for branches about
// to be made of it: it waits for (or rushes) a pending background freeze,
// and builds the layer now when this host has none (never frozen, as in
// the CLI's direct mode, Options.FreezeOnBranch, or pruned since): one
// build the branches then stack on, costing about what one materialised
// branch does, where each branch would otherwise copy the layer. The file
// bytes come from cp's sandbox's live layer where they still hash to cp's
// tree, else from the store; unchanged files are linked from the parent
// checkpoint's layer if this host has it. A failed build is logged by
// freeze, and the branches materialise.
// size is the tree's bytes (what a build from nothing writes).
func (e *Engine) freezeForBranch(ctx context.Context, be rootfs.Backend, cp *delta.Checkpoint, size uint64) error {
	ob, ok := be.(*overlay.Backend)
	if !ok || e.frozenKeep() == 0 {
		return nil
	}
	if err := e.awaitFreeze(ctx, cp.FSTree); err != nil {
		return err
	}
	if ob.HasFrozen(cp.FSTree) {
		return nil
	}
	j := &freezeJob{cp: cp, sandbox: cp.Sandbox, room: size, rush: true} // needed now: it does not pause
	if live, err := overlay.LiveUpper(e.home.sandboxDir(cp.Sandbox)); err == nil {
		j.live = live
	}
	if !cp.Parent.IsZero() {
		e.view(ctx, func(tx *catalog.Tx) error {
			if parent, err := tx.Checkpoint(cp.Parent); err == nil {
				j.parent = parent.FSTree
			}
			return nil
		})
	}
	// Registered as a job already claimed: a concurrent branch of the same
	// checkpoint waits for this build (awaitFreeze) instead of making its
	// own, and no background job of the tree is queued meanwhile.
	j.done = make(chan struct{})
	j.claimed = true
	f := &e.freezes
	f.mu.Lock()
	f.initLocked()
	if f.byTree[cp.FSTree] != nil {
		f.mu.Unlock() // queued or claimed since the wait above
		return e.awaitFreeze(ctx, cp.FSTree)
	}
	f.byTree[cp.FSTree] = j
	f.mu.Unlock()
	defer f.finish(j)
	e.freeze(ctx, j, nil)
	return nil
}

// branchRoot makes a branch's root of cp in dir: stacked on cp's frozen
// layer when this host keeps it or is freezing it (no file copied;
// freezeForBranch made it if it could), else materialised from the store.
func (e *Engine) branchRoot(ctx context.Context, be rootfs.Backend, dir, lower string, cp *delta.Checkpoint, materialise bool) (rootfs.Root, error) {
	ob, ok := be.(*overlay.Backend)
	if ok && !materialise && e.frozenKeep() > 0 {
		// A freeze in flight: its layer is moments away, and a stack costs
		// a mount where a copy costs the layer.
		if err := e.awaitFreeze(ctx, cp.FSTree); err != nil {
			return nil, err
		}
	}
	if ok && !materialise && e.frozenKeep() > 0 && ob.HasFrozen(cp.FSTree) {
		r, err := ob.CreateStacked(ctx, dir, lower, cp.FSTree, cp.StateKey)
		if !errors.Is(err, errdefs.ErrNotFound) {
			return r, err
		}
		// Pruned between the look and the stack: copy it after all.
	}
	return be.Create(ctx, dir, lower, cp.FSTree, e.repo)
}
