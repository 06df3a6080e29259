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
	Kept    int        `json:"kept"`
	Deleted []delta.ID `json:"deleted"`
}

// Prune deletes checkpoints beyond the newest KeepLast of each sandbox,
// keeping every head and every tagged checkpoint. A kept checkpoint needs no
// ancestor: each names its whole state (base tree and writable-layer tree),
// so nothing is replayed on restore and pruning an ancestor only shortens
// the log. Records go from the bucket, the local store and the catalog;
// run gc afterwards to reclaim the packs nothing references any more.
func (e *Engine) Prune(ctx context.Context, opts PruneOptions) (*PruneReport, error) {
	defer e.exclusive()()
	if opts.KeepLast < 1 {
		return nil, fmt.Errorf("prune: --keep-last must be at least 1: %w", errdefs.ErrInvalid)
	}
	keep := map[delta.ID]bool{}
	bySandbox := map[string][]*delta.Checkpoint{}
	err := e.view(ctx, func(tx *catalog.Tx) error {
		for _, kind := range []delta.RefKind{delta.RefHead, delta.RefTag} {
			refs, err := tx.Refs(kind)
			if err != nil {
				return err
			}
			for _, r := range refs {
				keep[r.Target] = true
			}
		}
		return tx.ForEachCheckpoint(func(cp *delta.Checkpoint) error {
			bySandbox[cp.Sandbox] = append(bySandbox[cp.Sandbox], cp)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	rep := &PruneReport{}
	var drop []*delta.Checkpoint
	for _, cps := range bySandbox {
		slices.SortFunc(cps, func(a, b *delta.Checkpoint) int { return b.Created.Compare(a.Created) })
		for i, cp := range cps {
			if i < opts.KeepLast || keep[cp.ID] {
				rep.Kept++
				continue
			}
			drop = append(drop, cp)
		}
	}
	for _, cp := range drop {
		rep.Deleted = append(rep.Deleted, cp.ID)
		if opts.DryRun {
			continue
		}
		if err := e.deleteCheckpoint(ctx, cp); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// deleteCheckpoint removes one record everywhere and releases its
// references: bucket first (so another host's gc cannot keep seeing it),
// then the local store, then the catalog with its refcounts.
func (e *Engine) deleteCheckpoint(ctx context.Context, cp *delta.Checkpoint) error {
	name := delta.RecordName(cp.ID)
	if e.remote != nil {
		if err := e.remote.Delete(ctx, name); err != nil {
			return fmt.Errorf("checkpoint %s: delete remote record: %w", cp.ID.Short(), err)
		}
	}
	if err := e.local.Delete(ctx, name); err != nil {
		return fmt.Errorf("checkpoint %s: delete record: %w", cp.ID.Short(), err)
	}
	err := e.cat.Update(ctx, func(tx *catalog.Tx) error {
		if err := dequeue(tx, cp.Sandbox, name); err != nil {
			return err
		}
		return tx.DeleteCheckpoint(cp.ID)
	})
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
	}
	return e.releaseRefs(ctx, cp.Roots())
}

// releaseRefs drops one reference to each root and cascades into the
// children of trees whose count reaches zero, the mirror of how commits
// count (a tree counts its children once, when it is first stored).
func (e *Engine) releaseRefs(ctx context.Context, roots []delta.ID) error {
	for len(roots) > 0 {
		id := roots[len(roots)-1]
		roots = roots[:len(roots)-1]
		var n int64
		err := e.cat.Update(ctx, func(tx *catalog.Tx) (err error) {
			n, err = tx.AddRefCount(id, -1)
			return err
		})
		if err != nil {
			if errors.Is(err, errdefs.ErrPrecondition) {
				continue // already zero: counts are a hint, gc decides by marking
			}
			return err
		}
		if n > 0 {
			continue
		}
		t, err := delta.LoadTree(ctx, e.repo, id)
		if err != nil {
			continue // a chunk, or a tree we cannot read: nothing to cascade
		}
		for _, en := range t.Entries {
			switch en.Type {
			case delta.TypeDir:
				roots = append(roots, en.Subtree)
			case delta.TypeFile:
				roots = append(roots, en.Chunks...)
			}
		}
	}
	return nil
}
