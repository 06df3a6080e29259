// Package statememo keeps what rollbacks read again and again: the trees
// that passed delta.CheckState with their footprints, and the trees and
// chunks a rollback's plan loads from the store. RL loops reset a sandbox
// to one checkpoint over and over; each reset after the first then checks
// and reads almost nothing. Every item is content-addressed and was
// verified when first loaded, so the memo never changes an answer.
package statememo

import (
	"context"
	"sync"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
)

// Memo remembers the trees that passed delta.CheckState (with the
// rules a rollback applies) and their footprints, so rolling back to the
// same checkpoint again does not check its whole state again (RL loops
// reset to one checkpoint over and over). A check depends only on the
// trees, which are content-addressed; what a rollback then reads from the
// store (the trees on the diff's paths, the chunks it writes) is loaded
// and verified by the plan before the first write, as always.
type Memo struct {
	mu sync.Mutex
	m  map[delta.ID]delta.Footprint
	// trees keeps the trees rollbacks read (verified when first loaded):
	// a rollback reads the trees on the diff's paths of both states, the
	// same few each time in a loop.
	trees boundedMemo[[]byte]
	// decoded keeps the plans' decoded trees (fstree.TreeMemo), counted by
	// the length of their encodings (decoded, a tree takes about three
	// times that): decoding the trees on a diff's paths of both states
	// was a fifth of a rollback a few files away.
	decoded boundedMemo[*delta.Tree]
	// data keeps the chunks plans loaded (verified when first loaded):
	// a loop rewrites the same files from the same chunks each time, and
	// reading, decompressing and hashing them again was a tenth of such a
	// rollback's CPU.
	data boundedMemo[[]byte]
}

// The memo's budgets, and the largest item each keeps (a sixteenth).
const (
	treeMemoBytes    = 16 << 20
	decodedMemoBytes = 4 << 20
	dataMemoBytes    = 8 << 20
)

// boundedMemo keeps items by ID up to a byte budget; past it arbitrary
// items go. Its owner's mutex guards it.
type boundedMemo[V any] struct {
	m     map[delta.ID]memoItem[V]
	bytes int
}

type memoItem[V any] struct {
	v    V
	size int
}

func (b *boundedMemo[V]) get(id delta.ID) (V, bool) {
	it, ok := b.m[id]
	return it.v, ok
}

func (b *boundedMemo[V]) put(id delta.ID, v V, size, budget int) {
	if size > budget/16 {
		return
	}
	if _, ok := b.m[id]; ok {
		return
	}
	if b.m == nil {
		b.m = map[delta.ID]memoItem[V]{}
	}
	for k, it := range b.m {
		if b.bytes+size <= budget {
			break
		}
		delete(b.m, k)
		b.bytes -= it.size
	}
	b.m[id] = memoItem[V]{v: v, size: size}
	b.bytes += size
}

// Loader is next (the store's loader) with the memo in front.
func (m *Memo) Loader(next delta.BlobLoader) delta.BlobLoader { return memoLoader{m: m, next: next} }

type memoLoader struct {
	m    *Memo
	next delta.BlobLoader
}

// LoadBlob serves trees and chunks from the memo, and keeps what it loads
// from the store (which verified it). The bytes are shared: callers only
// read them.
func (l memoLoader) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	memo, budget := &l.m.trees, treeMemoBytes
	switch t {
	case delta.BlobTree:
	case delta.BlobData:
		memo, budget = &l.m.data, dataMemoBytes
	default:
		return l.next.LoadBlob(ctx, t, id)
	}
	l.m.mu.Lock()
	data, ok := memo.get(id)
	l.m.mu.Unlock()
	if ok {
		return data, nil
	}
	data, err := l.next.LoadBlob(ctx, t, id)
	if err != nil {
		return data, err
	}
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	memo.put(id, data, len(data), budget)
	return data, nil
}

// MemoTree is fstree.TreeMemo's: a tree a plan decoded before.
func (l memoLoader) MemoTree(id delta.ID) (*delta.Tree, bool) {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	return l.m.decoded.get(id)
}

// KeepTree keeps a tree a plan decoded from what l served (the store's
// bytes, verified when loaded).
func (l memoLoader) KeepTree(id delta.ID, t *delta.Tree, size int) {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	l.m.decoded.put(id, t, size, decodedMemoBytes)
}

// stateMemoMax bounds the memo; past it an arbitrary entry goes.
const stateMemoMax = 1024

// CheckState is delta.CheckState of tree through l (rules: a layer's),
// from the memo when tree passed before.
func (m *Memo) CheckState(ctx context.Context, l *fstree.CheckedLoader, tree delta.ID) (delta.Footprint, error) {
	m.mu.Lock()
	fp, ok := m.m[tree]
	m.mu.Unlock()
	if ok {
		l.Checked(tree, delta.StateRules{})
		return fp, nil
	}
	fp, err := l.CheckState(ctx, tree, delta.StateRules{})
	if err != nil {
		return fp, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[delta.ID]delta.Footprint{}
	}
	if len(m.m) >= stateMemoMax {
		for k := range m.m {
			delete(m.m, k)
			break
		}
	}
	m.m[tree] = fp
	return fp, nil
}
