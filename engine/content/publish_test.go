package content

import (
	"context"
	"slices"
	"testing"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/upload"
)

func newRepo(t *testing.T) *Repo {
	t.Helper()
	ctx := context.Background()
	store, err := upload.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cat, err := catalog.Open(ctx, t.TempDir(), catalog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	codec, err := delta.NewCodec()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(codec.Close)
	return New(store, cat, codec, nil)
}

// TestConcurrentOpsStoreOnceCountOnce is the dedup rule of Publish: two
// Ops both find chunk X and tree T (which names X) new and both store them;
// whichever publishes first wins. The catalog keeps the winner's locations,
// counts T's reference to X once (as a rebuild would), and the loser learns
// the winner's packs for its upload order.
func TestConcurrentOpsStoreOnceCountOnce(t *testing.T) {
	ctx := context.Background()
	r := newRepo(t)
	chunk := []byte("the same chunk, found new by two operations at once")
	x := delta.Hash(chunk)
	tree := &delta.Tree{Entries: []delta.Entry{{Name: "f", Type: delta.TypeFile, Mode: 0o644, Size: uint64(len(chunk)), Chunks: []delta.ID{x}}}}
	enc := tree.Encode()
	tid := delta.Hash(enc)
	a, b := r.Begin(), r.Begin()
	for _, op := range []*Op{a, b} {
		for _, blob := range []struct {
			t    delta.BlobType
			id   delta.ID
			data []byte
		}{{delta.BlobData, x, chunk}, {delta.BlobTree, tid, enc}} {
			isNew, err := op.SaveBlob(ctx, blob.t, blob.id, blob.data)
			if err != nil || !isNew {
				t.Fatalf("SaveBlob %s: new %v, %v; want new", blob.id.Short(), isNew, err)
			}
		}
	}
	if err := a.Publish(ctx, tid); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, tid); err != nil {
		t.Fatal(err)
	}
	if n := r.Duplicates(); n != 2 {
		t.Errorf("%d duplicates, want 2 (X and T)", n)
	}
	var aPacks []delta.ID
	for _, w := range a.Written() {
		id, _ := delta.ParsePackName(w.Name)
		aPacks = append(aPacks, id)
	}
	err := r.cat.View(ctx, func(tx *catalog.Tx) error {
		for _, id := range []delta.ID{x, tid} {
			loc, ok, err := tx.Blob(id)
			if err != nil || !ok || !slices.Contains(aPacks, loc.Pack) {
				t.Errorf("blob %s at %+v (found %v, %v), want in the first publisher's packs", id.Short(), loc, ok, err)
			}
		}
		if n, _ := tx.RefCount(x); n != 1 {
			t.Errorf("refcount of X = %d, want 1 (one distinct tree names it)", n)
		}
		if n, _ := tx.RefCount(tid); n != 2 {
			t.Errorf("refcount of T = %d, want 2 (two records' roots)", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range aPacks {
		if !slices.Contains(b.Reused(), p) {
			t.Errorf("second publisher does not list pack %s it now depends on", p.Short())
		}
	}
	// Both read the blobs back through the winner's copy.
	for _, op := range []*Op{a, b} {
		got, err := op.LoadBlob(ctx, delta.BlobData, x)
		if err != nil || string(got) != string(chunk) {
			t.Errorf("LoadBlob X: %q, %v", got, err)
		}
	}
}
