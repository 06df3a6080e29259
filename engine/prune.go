package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// PruneOptions configures Prune.
type PruneOptions struct {
	KeepLast int // per sandbox, newest first; at least 1
	DryRun   bool
}

// PruneReport lists what Prune removed.
type PruneReport struct {
	Kept    int        `json:"checkpoints_kept"`
	Deleted []delta.ID `json:"deleted"`
	// Checkpoints describes each deleted checkpoint (for the text report).
	Checkpoints []RetentionEntry `json:"-"`
}

// Prune deletes checkpoints beyond the newest KeepLast of each sandbox,
// keeping every head and every tagged checkpoint. A kept checkpoint needs no
// ancestor: each names its whole state (base tree and writable-layer tree),
// so nothing is replayed on restore and pruning an ancestor only shortens
// the log. Records go from the bucket, the local store and the catalog
// (and the upload queue); run gc afterwards to reclaim the packs nothing
// references any more.
//
// Only what this home owns is pruned: the checkpoints of sandboxes created
// here (Sandbox.Home, including those removed since), and of legacy
// sandboxes and records that carry no owner. Another home's sandboxes, seen here after a catalog rebuild of a
// shared bucket, and records of an id'd sandbox this catalog does not know,
// are left alone.
func (e *Engine) Prune(ctx context.Context, opts PruneOptions) (*PruneReport, error) {
	defer e.exclusive()()
	if opts.KeepLast < 1 {
		return nil, fmt.Errorf("prune: --keep-last must be at least 1: %w", errdefs.ErrInvalid)
	}
	h, err := e.loadHistory(ctx)
	if err != nil {
		return nil, err
	}
	rep := &PruneReport{}
	var drop []*delta.Checkpoint
	for key, cps := range h.bySandbox {
		if !h.mayPrune(key) {
			rep.Kept += len(cps)
			continue
		}
		slices.SortFunc(cps, func(a, b *delta.Checkpoint) int { return b.Created.Compare(a.Created) })
		for i, cp := range cps {
			if i < opts.KeepLast || h.pin[cp.ID] != nil {
				rep.Kept++
				continue
			}
			drop = append(drop, cp)
		}
	}
	slices.SortFunc(drop, func(a, b *delta.Checkpoint) int { return a.Created.Compare(b.Created) })
	for _, cp := range drop {
		rep.Deleted = append(rep.Deleted, cp.ID)
		rep.Checkpoints = append(rep.Checkpoints, RetentionEntry{ID: cp.ID, Sandbox: h.label(cp), Turn: cp.Turn, Created: cp.Created})
	}
	if opts.DryRun {
		return rep, nil
	}
	for len(drop) > 0 {
		n := min(len(drop), pruneBatch)
		if err := e.deleteCheckpoints(ctx, drop[:n]); err != nil {
			return rep, err
		}
		drop = drop[n:]
	}
	e.dropFrozen(ctx)
	return rep, nil
}

// pruneBatch is how many checkpoints one catalog transaction of a prune
// deletes (Badger refuses a transaction past its size limit).
const pruneBatch = 500

// deleteCheckpoints removes records everywhere and releases their
// references: bucket first (so another host's gc cannot keep seeing them),
// then the local store, then the catalog with the upload queue (a record
// that is gone must not stay queued: a push could never send it) and the
// refcounts.
func (e *Engine) deleteCheckpoints(ctx context.Context, cps []*delta.Checkpoint) error {
	names := map[string]bool{}
	var roots []delta.ID
	for _, cp := range cps {
		name := delta.RecordName(cp.ID)
		if e.remote != nil {
			if err := e.remote.Delete(ctx, name); err != nil {
				return fmt.Errorf("checkpoint %s: delete remote record: %w", cp.ID.Short(), err)
			}
		}
		if err := e.local.Delete(ctx, name); err != nil {
			return fmt.Errorf("checkpoint %s: delete record: %w", cp.ID.Short(), err)
		}
		names[name] = true
		roots = append(roots, cp.Roots()...)
	}
	err := e.cat.Update(ctx, func(tx *catalog.Tx) error {
		if _, err := tx.DequeueNames(names); err != nil {
			return err
		}
		for _, cp := range cps {
			if err := tx.DeleteCheckpoint(cp.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				return fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return e.releaseRefs(ctx, roots)
}

// releaseRefs drops one reference to each root and cascades into the
// children of trees whose count reaches zero, the mirror of how commits
// count (a tree counts its children once, when it is first stored). It
// works level by level, a bounded batch of decrements per transaction.
func (e *Engine) releaseRefs(ctx context.Context, roots []delta.ID) error {
	for len(roots) > 0 {
		n := min(len(roots), releaseBatch)
		batch := roots[:n]
		roots = roots[n:]
		var zero []delta.ID
		err := e.cat.Update(ctx, func(tx *catalog.Tx) error {
			zero = zero[:0]
			for _, id := range batch {
				left, err := tx.AddRefCount(id, -1)
				if errors.Is(err, errdefs.ErrPrecondition) {
					continue // already zero: counts are a hint, gc decides by marking
				}
				if err != nil {
					return err
				}
				if left == 0 {
					zero = append(zero, id)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, id := range zero {
			t, err := delta.LoadTree(ctx, e.repo, id)
			if err != nil {
				continue // a chunk, or a tree we cannot read: nothing to cascade
			}
			roots = append(roots, t.Refs()...)
		}
	}
	return nil
}

// releaseBatch bounds the refcount decrements of one transaction.
const releaseBatch = 2000
