package statememo

import (
	"context"
	"errors"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

type none struct{}

func (none) LoadBlob(context.Context, delta.BlobType, delta.ID) ([]byte, error) {
	return nil, errdefs.ErrNotFound
}

// Trees keep trees only, answer them from memory (also through Over, which
// shares them), and pass everything else to next.
func TestTreesKeepTreesOnly(t *testing.T) {
	ctx := context.Background()
	m := NewTrees(none{})
	tree, chunk := []byte("a tree"), []byte("a chunk")
	tid, cid := delta.Hash(tree), delta.Hash(chunk)
	for _, c := range []struct {
		bt   delta.BlobType
		id   delta.ID
		data []byte
	}{{delta.BlobTree, tid, tree}, {delta.BlobData, cid, chunk}} {
		if isNew, err := m.SaveBlob(ctx, c.bt, c.id, c.data); isNew || err != nil {
			t.Fatalf("SaveBlob: new %v, %v; want false, nil (nothing is stored)", isNew, err)
		}
	}
	tree[0] = 'X' // the memo kept its own copy
	if got, err := m.Over(none{}).LoadBlob(ctx, delta.BlobTree, tid); err != nil || string(got) != "a tree" {
		t.Fatalf("tree through Over: %q, %v", got, err)
	}
	if _, err := m.LoadBlob(ctx, delta.BlobData, cid); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a chunk was kept: %v", err)
	}
	if m.Size() != len("a tree") {
		t.Fatalf("Size %d, want %d", m.Size(), len("a tree"))
	}
}
