package content

import (
	"context"
	"fmt"

	"github.com/turnsnap/turnsnap/delta"
)

// Walker visits every blob reachable from tree roots once: each distinct
// tree is loaded and decoded once however many checkpoints share it, so
// walking a history costs what its distinct trees cost.
type Walker struct {
	Loader delta.BlobLoader
	Seen   map[delta.ID]bool
	// visit is called once per distinct blob (trees and chunks).
	Visit func(id delta.ID, t delta.BlobType) error
}

// Walk visits root and everything below it not yet seen.
func (w *Walker) Walk(ctx context.Context, root delta.ID) error {
	if w.Seen[root] {
		return nil
	}
	w.Seen[root] = true
	if err := w.Visit(root, delta.BlobTree); err != nil {
		return err
	}
	t, err := delta.LoadTreeShallow(ctx, w.Loader, root)
	if err != nil {
		return err
	}
	for _, en := range t.Entries {
		switch en.Type {
		case delta.TypeDir:
			if err := w.Walk(ctx, en.Subtree); err != nil {
				return err
			}
		case delta.TypeFile:
			chunks := en.Chunks
			if en.Indirect() {
				// The list is a tree blob of its own, loaded once however
				// many trees name it (an unchanged big file, turn after turn).
				if w.Seen[en.ChunkList] {
					continue
				}
				w.Seen[en.ChunkList] = true
				if err := w.Visit(en.ChunkList, delta.BlobTree); err != nil {
					return err
				}
				if chunks, err = delta.LoadChunkList(ctx, w.Loader, en.ChunkList, en.NChunks); err != nil {
					return fmt.Errorf("tree %s: file %q: %w", root.Short(), en.Name, err)
				}
			}
			for _, c := range chunks {
				if !w.Seen[c] {
					w.Seen[c] = true
					if err := w.Visit(c, delta.BlobData); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}
