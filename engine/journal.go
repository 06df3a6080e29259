package engine

import (
	"context"

	"github.com/turnsnap/turnsnap/delta"
)

// Blobs reads the content repository's blobs (verified by hash) under the
// engine's shared lock, so a read never meets gc or a store swap half way:
// the LLM proxy's journal reads its committed entries through it.
func (e *Engine) Blobs() delta.BlobLoader { return engineBlobs{e} }

type engineBlobs struct{ e *Engine }

func (b engineBlobs) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	done := b.e.shared()
	defer done()
	return b.e.data.repo.LoadBlob(ctx, t, id)
}
