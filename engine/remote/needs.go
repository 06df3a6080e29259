package remote

import (
	"context"
	"fmt"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// needs derives what each record really needs upstream: the packs holding
// every blob it reaches. Records walked by one needs share trees (a
// sandbox's base, unchanged directories); a tree is walked once, by the
// first record that reaches it, and a later record that reaches it again
// depends on that first record instead, which in turn waits for the packs.
// So every record's dependencies cover all it reaches, and each tree is
// read once however many records share it.
type needs struct {
	cat   *catalog.Catalog
	load  delta.BlobLoader
	owner map[delta.ID]string // tree → name of the record that walked it
	seenC map[delta.ID]bool   // chunks already located
}

func newNeeds(cat *catalog.Catalog, load delta.BlobLoader) *needs {
	return &needs{cat: cat, load: load, owner: map[delta.ID]string{}, seenC: map[delta.ID]bool{}}
}

// record walks cp's roots and calls pack for each pack it needs that no
// earlier record walked, and rec for each earlier record it shares a tree
// with.
func (n *needs) record(ctx context.Context, cp *delta.Checkpoint, pack, rec func(name string)) error {
	self := delta.RecordName(cp.ID)
	others := map[string]bool{}
	stack := append([]delta.ID(nil), cp.Roots()...)
	for len(stack) > 0 {
		id := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if o, ok := n.owner[id]; ok {
			if o != self && !others[o] {
				others[o] = true
				rec(o)
			}
			continue
		}
		n.owner[id] = self
		t, err := delta.LoadTreeShallow(ctx, n.load, id)
		if err != nil {
			return fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
		}
		blobs := []delta.ID{id}
		for _, en := range t.Entries {
			switch en.Type {
			case delta.TypeDir:
				stack = append(stack, en.Subtree)
			case delta.TypeFile:
				chunks := en.Chunks
				if en.Indirect() {
					// The list's pack, and its chunks' packs, once per list
					// (an unchanged big file is named turn after turn).
					if n.seenC[en.ChunkList] {
						continue
					}
					n.seenC[en.ChunkList] = true
					blobs = append(blobs, en.ChunkList)
					if chunks, err = delta.LoadChunkList(ctx, n.load, en.ChunkList, en.NChunks); err != nil {
						return fmt.Errorf("checkpoint %s: tree %s: file %q: %w", cp.ID.Short(), id.Short(), en.Name, err)
					}
				}
				for _, c := range chunks {
					if !n.seenC[c] {
						n.seenC[c] = true
						blobs = append(blobs, c)
					}
				}
			}
		}
		err = n.cat.View(ctx, func(tx *catalog.Tx) error {
			for _, b := range blobs {
				loc, ok, err := tx.Blob(b)
				if err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("checkpoint %s: blob %s has no known pack: %w", cp.ID.Short(), b.Short(), errdefs.ErrNotFound)
				}
				pack(delta.PackName(loc.Pack))
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
