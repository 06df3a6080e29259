package frozen

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Frozen layers for branches (docs/ARCHITECTURE.md, "Frozen layers"): a
// branch on overlay stacks on its checkpoint's layer, built for it when
// this host has none; with Deps.OnBranch (the CLI's direct mode) that is
// how a sandbox's first layer is made.

// sourceLayer is the kept layer a freeze of sandbox's next layer is made
// from (linking the files that did not change): the one its root stacks
// on, else its parent checkpoint's tree's (zero: none, a build from
// nothing). With Deps.OnBranch only freezes with a source run
// after a checkpoint, so a sandbox that was branched (or is a branch)
// keeps layers at the cost of its changes, and one never branched pays
// nothing.
func (k *Keeper) sourceLayer(sandbox string, parent delta.ID) delta.ID {
	ob := k.d.Layers
	if dir := k.d.StackedOn(k.sandboxDir(sandbox)); dir != "" {
		if id, err := delta.ParseID(filepath.Base(dir)); err == nil && ob.Has(id) {
			return id
		}
	}
	if !parent.IsZero() && ob.Has(parent) {
		return parent
	}
	return delta.ID{}
}

// PrepareBranch makes sure cp's frozen layer exists for branches about
// to be made of it, and reports whether they will stack on it: it waits
// for (or rushes) a pending background freeze, and builds the layer now
// when this host has none (never frozen, as in the CLI's direct mode,
// Deps.OnBranch, or pruned since): one
// build the branches then stack on, costing about what one materialised
// branch does, where each branch would otherwise copy the layer. The file
// bytes come from cp's sandbox's live layer where they still hash to cp's
// tree, else from the store; unchanged files are linked from the parent
// checkpoint's layer if this host has it. A failed build is logged by
// freeze, and the branches materialise.
// size is the tree's bytes (what a build from nothing writes).
func (k *Keeper) PrepareBranch(ctx context.Context, cp *delta.Checkpoint, size uint64) (bool, error) {
	if err := k.freezeForBranch(ctx, cp, size); err != nil {
		return false, err
	}
	return k.keep() > 0 && k.d.Layers.Has(cp.FSTree), nil
}

func (k *Keeper) freezeForBranch(ctx context.Context, cp *delta.Checkpoint, size uint64) error {
	ob := k.d.Layers
	if k.keep() == 0 {
		return nil
	}
	if err := k.awaitFreeze(ctx, cp.FSTree); err != nil {
		return err
	}
	if ob.Has(cp.FSTree) {
		return nil
	}
	j := &freezeJob{cp: cp, sandbox: string(cp.Sandbox), room: size, rush: true} // needed now: it does not pause
	if live, err := k.d.LiveUpper(k.sandboxDir(string(cp.Sandbox))); err == nil {
		j.live = live
	}
	if !cp.Parent.IsZero() {
		// The parent's layer is only a source of links: a parent pruned
		// since leaves none, but a catalog that cannot be read is the
		// branch's error.
		err := k.d.View(ctx, func(tx Lines) error {
			parent, err := tx.Checkpoint(cp.Parent)
			if err == nil {
				j.parent = parent.FSTree
			}
			if errors.Is(err, errdefs.ErrNotFound) {
				return nil
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("checkpoint %s: parent %s: %w", cp.ID.Short(), cp.Parent.Short(), err)
		}
	}
	// Registered as a job already claimed: a concurrent branch of the same
	// checkpoint waits for this build (awaitFreeze) instead of making its
	// own, and no background job of the tree is queued meanwhile.
	j.done = make(chan struct{})
	j.claimed = true
	f := &k.freezes
	f.mu.Lock()
	f.initLocked()
	if f.byTree[cp.FSTree] != nil {
		f.mu.Unlock() // queued or claimed since the wait above
		return k.awaitFreeze(ctx, cp.FSTree)
	}
	f.byTree[cp.FSTree] = j
	f.mu.Unlock()
	defer f.finish(j)
	k.freeze(ctx, j, nil)
	return nil
}

// AwaitLayer returns once a branch of cp may stack on its frozen layer:
// a freeze of it in flight has finished (its layer is moments away, and a
// stack costs a mount where a copy costs the layer). It fails with
// errdefs.ErrNotFound when this host keeps no layer of cp (or freezing
// is off): the branch then materialises.
func (k *Keeper) AwaitLayer(ctx context.Context, cp *delta.Checkpoint) error {
	if k.keep() == 0 {
		return errdefs.ErrNotFound
	}
	if err := k.awaitFreeze(ctx, cp.FSTree); err != nil {
		return err
	}
	if !k.d.Layers.Has(cp.FSTree) {
		return errdefs.ErrNotFound
	}
	return nil
}

// TurnStarted counts a checkpoint in flight until done is called:
// background freezes wait while turns run (idle.go).
func (k *Keeper) TurnStarted() (done func()) { return k.freezes.turnStarted() }
