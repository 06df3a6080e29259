package check

import (
	"context"
	"fmt"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// CountRefs recomputes refcounts as commits maintain them: each checkpoint
// references its fs and base trees, each distinct tree its children.
func CountRefs(ctx context.Context, loader delta.BlobLoader, cps []*delta.Checkpoint) (map[delta.ID]int64, error) {
	counts := map[delta.ID]int64{}
	seen := map[delta.ID]bool{}
	var walk func(id delta.ID) error
	walk = func(id delta.ID) error {
		if seen[id] {
			return nil
		}
		seen[id] = true
		t, err := delta.LoadTreeShallow(ctx, loader, id)
		if err != nil {
			return err
		}
		for _, r := range t.Refs() {
			counts[r]++
		}
		for _, en := range t.Entries {
			switch {
			case en.Type == delta.TypeDir:
				if err := walk(en.Subtree); err != nil {
					return err
				}
			case en.Indirect() && !seen[en.ChunkList]:
				// A chunk list counts its chunks once, as a tree its children.
				seen[en.ChunkList] = true
				chunks, err := delta.LoadChunkList(ctx, loader, en.ChunkList, en.NChunks)
				if err != nil {
					return fmt.Errorf("tree %s: file %q: %w", id.Short(), en.Name, err)
				}
				for _, c := range chunks {
					counts[c]++
				}
			}
		}
		return nil
	}
	for _, cp := range cps {
		for _, root := range cp.Roots() {
			counts[root]++
			if err := walk(root); err != nil {
				return nil, fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
			}
		}
	}
	return counts, nil
}

// Refcounts compares the catalog's reference counts with a recount over
// every checkpoint it holds, as a rebuild would make them; the first
// difference is an error wrapping ErrCorrupt.
func (c *Checker) Refcounts(ctx context.Context, cat *catalog.Catalog) error {
	var cps []*delta.Checkpoint
	have := map[delta.ID]int64{}
	err := cat.View(ctx, func(tx *catalog.Tx) error {
		if err := tx.ForEachCheckpoint(func(cp *delta.Checkpoint) error {
			cps = append(cps, cp)
			return nil
		}); err != nil {
			return err
		}
		return tx.ForEachRefCount(func(id delta.ID, n int64) error {
			have[id] = n
			return nil
		})
	})
	if err != nil {
		return err
	}
	want, err := CountRefs(ctx, c.Blobs, cps)
	if err != nil {
		return err
	}
	for id, n := range want {
		if have[id] != n {
			return fmt.Errorf("object %s: catalog counts %d references, a recount %d: %w", id, have[id], n, errdefs.ErrCorrupt)
		}
	}
	for id, n := range have {
		if _, ok := want[id]; !ok {
			return fmt.Errorf("object %s: catalog counts %d references, a recount none: %w", id, n, errdefs.ErrCorrupt)
		}
	}
	return nil
}

// All verifies every checkpoint in the catalog, then its refcounts.
func (c *Checker) All(ctx context.Context, cat *catalog.Catalog) error {
	var cps []*delta.Checkpoint
	if err := cat.View(ctx, func(tx *catalog.Tx) error {
		return tx.ForEachCheckpoint(func(cp *delta.Checkpoint) error {
			cps = append(cps, cp)
			return nil
		})
	}); err != nil {
		return err
	}
	for _, cp := range cps {
		if _, err := c.Verify(ctx, cp); err != nil {
			return err
		}
	}
	return c.Refcounts(ctx, cat)
}
