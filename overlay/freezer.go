package overlay

import (
	"context"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"github.com/turnsnap/turnsnap/overlay/frozen"
)

// Frozen layers (docs/STORAGE.md, "Frozen layers") are the backend's: it
// keeps them (package frozen's Layers) and stacks branches on them
// (stack.go), and once SetFreezing gives it the engine's services it runs
// their policy (frozen.Keeper) behind rootfs.Freezer. Without it no layer
// is kept and every branch is created by copying.

// SetFreezing starts the frozen layers' policy with the engine's services
// in d; the backend fills in its own parts (Layers, LiveUpper, StackedOn).
// Call it once, before the backend is used; Close stops it.
func (b *Backend) SetFreezing(d frozen.Deps) {
	d.Layers, d.LiveUpper, d.StackedOn = b.layers, LiveUpper, FrozenUser
	b.keeper = frozen.NewKeeper(d)
}

// Layers is the frozen layers this backend's roots stack on.
func (b *Backend) Layers() *frozen.Layers { return b.layers }

// Keeper is the frozen layers' policy (nil before SetFreezing).
func (b *Backend) Keeper() *frozen.Keeper { return b.keeper }

// TurnStarted is rootfs.Freezer's: background freezes wait while turns run.
func (b *Backend) TurnStarted() (done func()) {
	if b.keeper == nil {
		return func() {}
	}
	return b.keeper.TurnStarted()
}

// FreezeLater is rootfs.Freezer's: it queues the background freeze of cp.
func (b *Backend) FreezeLater(sandbox string, parent delta.ID, cp *delta.Checkpoint) {
	if b.keeper != nil {
		b.keeper.FreezeLater(sandbox, parent, cp)
	}
}

// PrepareBranch is rootfs.Freezer's (frozen.Keeper.PrepareBranch).
func (b *Backend) PrepareBranch(ctx context.Context, cp *delta.Checkpoint, size uint64) (bool, error) {
	if b.keeper == nil {
		return false, nil
	}
	return b.keeper.PrepareBranch(ctx, cp, size)
}

// StackBranch is rootfs.Freezer's: a branch's root of cp stacked on cp's
// frozen layer, once a freeze of it in flight is done; errdefs.ErrNotFound
// when this host keeps no such layer (or it was pruned between the look
// and the stack).
func (b *Backend) StackBranch(ctx context.Context, dir, base string, cp *delta.Checkpoint) (rootfs.Root, error) {
	if b.keeper == nil {
		return nil, errdefs.ErrNotFound
	}
	if err := b.keeper.AwaitLayer(ctx, cp); err != nil {
		return nil, err
	}
	return b.CreateStacked(ctx, dir, base, cp.FSTree, cp.StateKey)
}

// PruneFrozen is rootfs.Freezer's: the retention pass over the layers.
func (b *Backend) PruneFrozen(ctx context.Context) error {
	if b.keeper == nil {
		return nil
	}
	return b.keeper.Prune(ctx)
}

// WaitFreezes is rootfs.Freezer's: it waits until no background freeze is
// pending.
func (b *Backend) WaitFreezes() {
	if b.keeper != nil {
		b.keeper.WaitFreezes()
	}
}

// VerifyFrozen is rootfs.Freezer's: it re-hashes tree's layer, if kept.
func (b *Backend) VerifyFrozen(ctx context.Context, tree delta.ID) (bool, error) {
	return b.layers.Verify(ctx, tree)
}

// Close stops the backend's background work: its change trackers (their
// scan caches saved), its bases' watches, then its freezes (cancelled, and waited for), and
// waits for removed layers' deletions.
func (b *Backend) Close() error {
	b.closeTrackers()
	b.watches.closeAll()
	if b.keeper != nil {
		b.keeper.Close()
	} else {
		b.layers.WaitRemovals()
	}
	return nil
}

var (
	_ rootfs.Freezer     = (*Backend)(nil)
	_ rootfs.TurnScanner = (*Backend)(nil)
	_ rootfs.Rollbacker  = (*Backend)(nil)
)
