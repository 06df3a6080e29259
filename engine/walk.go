package engine

import (
	"context"

	"github.com/turnsnap/turnsnap/delta"
)

// walker visits every blob reachable from tree roots once: each distinct
// tree is loaded and decoded once however many checkpoints share it, so
// walking a history costs what its distinct trees cost.
type walker struct {
	loader delta.BlobLoader
	seen   map[delta.ID]bool
	// visit is called once per distinct blob (trees and chunks).
	visit func(id delta.ID, t delta.BlobType) error
}

func (w *walker) walk(ctx context.Context, root delta.ID) error {
	if w.seen[root] {
		return nil
	}
	w.seen[root] = true
	if err := w.visit(root, delta.BlobTree); err != nil {
		return err
	}
	t, err := delta.LoadTree(ctx, w.loader, root)
	if err != nil {
		return err
	}
	for _, en := range t.Entries {
		switch en.Type {
		case delta.TypeDir:
			if err := w.walk(ctx, en.Subtree); err != nil {
				return err
			}
		case delta.TypeFile:
			for _, c := range en.Chunks {
				if !w.seen[c] {
					w.seen[c] = true
					if err := w.visit(c, delta.BlobData); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}
