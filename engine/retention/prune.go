package retention

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// PruneOptions configures Prune.
type PruneOptions struct {
	KeepLast int // per sandbox, newest first; at least 1
	DryRun   bool
	// Grace is how long records stay marked before a later run may delete
	// them, on a home with a remote (DefaultRecordGrace is the CLI's
	// default). 0 (or negative) sweeps in this run, after re-reading every
	// ref in the bucket. Without a remote records are deleted at once.
	Grace time.Duration
}

// PruneReport lists what Prune removed and what it marked.
type PruneReport struct {
	Kept    int        `json:"checkpoints_kept"`
	Deleted []delta.ID `json:"deleted"`
	// Checkpoints describes each deleted checkpoint (for the text report).
	Checkpoints []Entry `json:"-"`
	// Marked are the checkpoints marked for deletion and not deleted yet:
	// each is deleted by a prune, forget or gc after its DeleteAfter,
	// unless a ref in the bucket names it by then.
	Marked []Entry `json:"marked"`
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
//
// With a remote, what is pinned includes every ref in the bucket (any
// home's heads, tags, branch origins), and deletion is two-phase (mark,
// grace, sweep: see retire).
func (rt *Retention) Prune(ctx context.Context, opts PruneOptions) (*PruneReport, error) {
	defer rt.d.Exclusive()()
	o := rt.op()
	if opts.KeepLast < 1 {
		return nil, fmt.Errorf("prune: --keep-last must be at least 1: %w", errdefs.ErrInvalid)
	}
	h, err := o.d.LoadHistory(ctx)
	if err != nil {
		return nil, err
	}
	if err := o.addBucketPins(ctx, h); err != nil {
		return nil, fmt.Errorf("prune: %w", err)
	}
	rep := &PruneReport{Deleted: []delta.ID{}, Marked: []Entry{}}
	var drop []*delta.Checkpoint
	covered := map[string]bool{}
	for key, cps := range h.BySandbox {
		if !h.mayPrune(key) {
			rep.Kept += len(cps)
			continue
		}
		covered[key] = true
		slices.SortFunc(cps, func(a, b *delta.Checkpoint) int { return b.Created.Compare(a.Created) })
		for i, cp := range cps {
			if i < opts.KeepLast || h.Pin[cp.ID] != nil {
				rep.Kept++
				continue
			}
			drop = append(drop, cp)
		}
	}
	slices.SortFunc(drop, func(a, b *delta.Checkpoint) int { return a.Created.Compare(b.Created) })
	r, err := o.retire(ctx, h, drop, covered, opts.Grace, opts.DryRun)
	if r != nil {
		for _, cp := range append(r.swept, drop...) {
			en := Entry{ID: cp.ID, Sandbox: h.label(cp), Turn: cp.Turn, Created: cp.Created}
			switch due, marked := r.marked[cp.ID]; {
			case r.deleted[cp.ID]:
				rep.Deleted = append(rep.Deleted, cp.ID)
				rep.Checkpoints = append(rep.Checkpoints, en)
			case marked:
				en.DeleteAfter = due
				rep.Marked = append(rep.Marked, en)
			default:
				rep.Kept++ // left for a later run (the mark object is full)
			}
		}
	}
	if err != nil {
		return rep, err
	}
	if !opts.DryRun {
		o.d.DropFrozen(ctx)
	}
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
func (o *op) deleteCheckpoints(ctx context.Context, cps []*delta.Checkpoint) error {
	names := map[string]bool{}
	var roots []delta.ID
	for _, cp := range cps {
		name := delta.RecordName(cp.ID)
		if o.Remote != nil {
			if err := o.Remote.Delete(ctx, name); err != nil {
				return fmt.Errorf("checkpoint %s: delete remote record: %w", cp.ID.Short(), err)
			}
		}
		if err := o.Local.Delete(ctx, name); err != nil {
			return fmt.Errorf("checkpoint %s: delete record: %w", cp.ID.Short(), err)
		}
		names[name] = true
		roots = append(roots, cp.Roots()...)
	}
	err := o.Catalog.Update(ctx, func(tx *catalog.Tx) error {
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
	return o.releaseRefs(ctx, roots)
}

// releaseRefs drops one reference to each root and cascades into the
// children of trees whose count reaches zero, the mirror of how commits
// count (a tree counts its children once, when it is first stored). It
// works level by level, a bounded batch of decrements per transaction.
func (o *op) releaseRefs(ctx context.Context, roots []delta.ID) error {
	for len(roots) > 0 {
		n := min(len(roots), releaseBatch)
		batch := roots[:n]
		roots = roots[n:]
		var zero []delta.ID
		err := o.Catalog.Update(ctx, func(tx *catalog.Tx) error {
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
			// A tree, or a chunk list (stored as a tree blob), releases
			// what it counted when it was stored.
			data, err := o.Blobs.LoadBlob(ctx, delta.BlobTree, id)
			if err != nil {
				continue // a chunk, or a tree we cannot read: nothing to cascade
			}
			refs, err := delta.BlobRefs(data)
			if err != nil {
				continue // a chunk: nothing to cascade
			}
			roots = append(roots, refs...)
		}
	}
	return nil
}

// releaseBatch bounds the refcount decrements of one transaction.
const releaseBatch = 2000
