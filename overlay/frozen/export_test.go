package frozen

import (
	"context"

	"github.com/turnsnap/turnsnap/delta"
)

// The layers' internals the external tests (package frozen_test, which
// builds layers of overlay uppers) look at.

func (b *Layers) Top() string { return b.top }

func (b *Layers) HasLinks(ctx context.Context, loader delta.BlobLoader, id delta.ID) (bool, error) {
	return b.hasLinks(ctx, loader, id)
}

func (b *Layers) ReadLayer(tree delta.ID) (int, func(), error) { return b.readLayer(tree) }
