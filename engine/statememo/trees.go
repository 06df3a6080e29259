package statememo

import (
	"bytes"
	"context"
	"sync"

	"github.com/turnsnap/turnsnap/delta"
)

// Trees keeps the trees a scan saves in memory, so its state can be
// compared or diffed without storing anything; everything else is read
// from next. A checkpoint's turn, a restore's receipt, a diff against the
// live root and the head trees a sandbox's next turn compares with all use
// one.
type Trees struct {
	mu    *sync.Mutex
	next  delta.BlobLoader
	trees map[delta.ID][]byte
}

// NewTrees returns an empty memo in front of next.
func NewTrees(next delta.BlobLoader) *Trees {
	return &Trees{mu: new(sync.Mutex), next: next, trees: map[delta.ID][]byte{}}
}

// SaveBlob keeps a tree (other blobs are not kept) and reports it not new,
// so a scan saving through the memo stores nothing.
func (m *Trees) SaveBlob(_ context.Context, t delta.BlobType, id delta.ID, data []byte) (bool, error) {
	if t == delta.BlobTree {
		m.mu.Lock()
		m.trees[id] = bytes.Clone(data)
		m.mu.Unlock()
	}
	return false, nil
}

// LoadBlob answers a kept tree from memory, anything else from next.
func (m *Trees) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	m.mu.Lock()
	d, ok := m.trees[id]
	m.mu.Unlock()
	if ok {
		return d, nil
	}
	return m.next.LoadBlob(ctx, t, id)
}

// Over returns a memo of the same trees in front of next (nil: the trees
// alone, which then answer nothing else).
func (m *Trees) Over(next delta.BlobLoader) *Trees {
	return &Trees{mu: m.mu, next: next, trees: m.trees}
}

// Size is the bytes of the trees kept.
func (m *Trees) Size() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, t := range m.trees {
		n += len(t)
	}
	return n
}
