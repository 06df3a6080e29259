package engine

import (
	"context"

	"github.com/turnsnap/turnsnap/btrfs"
	"github.com/turnsnap/turnsnap/delta"
)

// btrfsBackend adapts package btrfs's concrete types to Backend.
type btrfsBackend struct{ *btrfs.Backend }

func (b btrfsBackend) Create(ctx context.Context, dir, base string, tree delta.ID, loader delta.BlobLoader) (Root, error) {
	r, err := b.Backend.Create(ctx, dir, base, tree, loader)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (b btrfsBackend) Open(dir, base string) Root { return b.Backend.Open(dir, base) }

// btrfsBackend returns the btrfs backend of the pool that cfg names
// (cfg[btrfs.ConfigPool]); it fails with ErrInvalid if the pool is missing
// or not on btrfs.
func (e *Engine) btrfsBackend(cfg map[string]string) (Backend, error) {
	b, err := btrfs.NewBackend(cfg[btrfs.ConfigPool], btrfs.Options{Logger: e.log})
	if err != nil {
		return nil, err
	}
	return btrfsBackend{b}, nil
}
