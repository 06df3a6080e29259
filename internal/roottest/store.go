package roottest

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// MemStore is an in-memory blob store: a BlobSaver and BlobLoader that
// checks hashes on load, as the real repository does.
type MemStore struct {
	ids     delta.IDs
	mu      sync.Mutex
	blobs   map[delta.ID][]byte
	corrupt map[delta.ID]bool
}

// NewMemStore returns an empty store holding the empty tree, checking
// plain IDs.
func NewMemStore() *MemStore { return NewMemStoreIDs(delta.IDs{}) }

// NewMemStoreIDs is NewMemStore checking IDs under ids.
func NewMemStoreIDs(ids delta.IDs) *MemStore {
	m := &MemStore{ids: ids, blobs: map[delta.ID][]byte{}, corrupt: map[delta.ID]bool{}}
	m.blobs[ids.EmptyTree()] = (&delta.Tree{}).Encode()
	return m
}

// SaveBlob stores a blob.
func (m *MemStore) SaveBlob(_ context.Context, _ delta.BlobType, id delta.ID, data []byte) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.blobs[id]; ok {
		return false, nil
	}
	m.blobs[id] = bytes.Clone(data)
	return true, nil
}

// LoadBlob returns a blob after checking its hash.
func (m *MemStore) LoadBlob(_ context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.blobs[id]
	if !ok {
		return nil, fmt.Errorf("%s blob %s: %w", t, id.Short(), errdefs.ErrNotFound)
	}
	if m.corrupt[id] {
		d = append(bytes.Clone(d), 'x')
	}
	if m.ids.Hash(d) != id {
		return nil, fmt.Errorf("%s blob %s: content does not match its hash: %w", t, id.Short(), errdefs.ErrCorrupt)
	}
	return d, nil
}

// Corrupt makes every later load of id fail its hash check.
func (m *MemStore) Corrupt(id delta.ID) {
	m.mu.Lock()
	m.corrupt[id] = true
	m.mu.Unlock()
}

// Len is the number of blobs stored.
func (m *MemStore) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.blobs)
}

// Holds reports whether any stored blob contains needle.
func (m *MemStore) Holds(needle []byte) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range m.blobs {
		if bytes.Contains(d, needle) {
			return true
		}
	}
	return false
}
