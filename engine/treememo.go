package engine

import (
	"bytes"
	"context"
	"sync"

	"github.com/turnsnap/turnsnap/delta"
)

// treeMemo keeps the trees of a live scan in memory so they can be diffed
// without storing anything; everything else comes from next.
type treeMemo struct {
	mu    sync.Mutex
	next  delta.BlobLoader
	trees map[delta.ID][]byte
}

func (m *treeMemo) SaveBlob(_ context.Context, t delta.BlobType, id delta.ID, data []byte) (bool, error) {
	if t == delta.BlobTree {
		m.mu.Lock()
		m.trees[id] = bytes.Clone(data)
		m.mu.Unlock()
	}
	return false, nil
}

func (m *treeMemo) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	m.mu.Lock()
	d, ok := m.trees[id]
	m.mu.Unlock()
	if ok {
		return d, nil
	}
	return m.next.LoadBlob(ctx, t, id)
}
