package statememo

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// countingStore serves blobs of a given size and counts its loads.
type countingStore struct {
	size  int
	loads map[delta.BlobType]int
	fail  map[delta.ID]bool
}

func (s *countingStore) LoadBlob(_ context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	s.loads[t]++
	if s.fail[id] {
		return nil, fmt.Errorf("blob %s: %w", id.Short(), errdefs.ErrNotFound)
	}
	b := make([]byte, s.size)
	copy(b, id[:])
	return b, nil
}

// The rollback loader's memo serves trees and chunks it loaded before and
// keeps within its budgets: an item over a sixteenth of one is not kept, a
// failed load is not kept, other blob types pass through, and filling a
// budget drops others instead of growing.
func TestRollbackMemoBounds(t *testing.T) {
	ctx := context.Background()
	store := &countingStore{size: 1000, loads: map[delta.BlobType]int{}, fail: map[delta.ID]bool{}}
	l := memoLoader{m: &Memo{}, next: store}
	id := func(i int) delta.ID { return delta.Hash([]byte(fmt.Sprint(i))) }
	for _, typ := range []delta.BlobType{delta.BlobTree, delta.BlobData} {
		for range 3 {
			data, err := l.LoadBlob(ctx, typ, id(1))
			if err != nil || len(data) != 1000 || [32]byte(data[:32]) != id(1) {
				t.Fatalf("%v: load: %v", typ, err)
			}
		}
		if store.loads[typ] != 1 {
			t.Fatalf("%v: %d loads from the store for one blob read three times", typ, store.loads[typ])
		}
	}
	store.fail[id(2)] = true
	for range 2 {
		if _, err := l.LoadBlob(ctx, delta.BlobData, id(2)); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("a failed load: %v", err)
		}
	}
	if store.loads[delta.BlobData] != 3 {
		t.Fatalf("a failed load was kept (%d loads)", store.loads[delta.BlobData])
	}
	store.size = dataMemoBytes/16 + 1
	l.LoadBlob(ctx, delta.BlobData, id(3))
	l.LoadBlob(ctx, delta.BlobData, id(3))
	if store.loads[delta.BlobData] != 5 {
		t.Fatalf("a chunk over a sixteenth of the budget was kept (%d loads)", store.loads[delta.BlobData])
	}
	store.size = dataMemoBytes / 16
	for i := range 100 {
		l.LoadBlob(ctx, delta.BlobData, id(100+i))
	}
	if m := &l.m.data; m.bytes > dataMemoBytes || len(m.m) > 16 {
		t.Fatalf("the chunk memo holds %d bytes in %d chunks, over its budget of %d", m.bytes, len(m.m), dataMemoBytes)
	}
	other := delta.BlobType(99)
	l.LoadBlob(ctx, other, id(1))
	l.LoadBlob(ctx, other, id(1))
	if store.loads[other] != 2 {
		t.Fatalf("a blob of another type was kept")
	}
	tr := &delta.Tree{}
	l.KeepTree(id(7), tr, 10)
	if got, ok := l.MemoTree(id(7)); !ok || got != tr {
		t.Fatal("a kept tree is not served")
	}
	l.KeepTree(id(8), &delta.Tree{}, decodedMemoBytes/16+1)
	if _, ok := l.MemoTree(id(8)); ok {
		t.Fatal("a tree over a sixteenth of the budget was kept")
	}
}
