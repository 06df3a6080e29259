package content

import (
	"bytes"
	"context"
	"crypto/rand"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/upload"
)

// TestSmallOpWritesOnePack: an op whose new blobs fit mixedPackMax stores
// them as one pack, its chunks before its trees; a larger one, or one that
// stores the same bytes as a chunk and as a tree, keeps trees in a pack of
// their own. Every blob loads back from the catalog's index either way.
func TestSmallOpWritesOnePack(t *testing.T) {
	ctx := context.Background()
	r := newRepo(t)
	random := func(n int) []byte {
		b := make([]byte, n)
		rand.Read(b)
		return b
	}
	treeOf := func(chunk []byte) []byte {
		return (&delta.Tree{Entries: []delta.Entry{{Name: "f", Type: delta.TypeFile, Mode: 0o644,
			Size: uint64(len(chunk)), Chunks: []delta.ID{delta.Hash(chunk)}}}}).Encode()
	}
	small := random(4 << 10)
	var large [][]byte // incompressible: with their tree they no longer fit
	for range mixedPackMax/(200<<10) + 1 {
		large = append(large, random(200<<10))
	}
	shared := treeOf([]byte("a chunk whose tree is also a file's bytes"))
	for _, c := range []struct {
		name   string
		chunks [][]byte
		packs  int
	}{
		{"small", [][]byte{small}, 1},
		{"large", large, len(large)/80 + 2},
		{"chunk equal to a tree", [][]byte{[]byte("a chunk whose tree is also a file's bytes"), shared}, 2},
	} {
		op := r.Begin()
		want := map[delta.ID]delta.BlobType{}
		for _, chunk := range c.chunks {
			if _, err := op.SaveBlob(ctx, delta.BlobData, delta.Hash(chunk), chunk); err != nil {
				t.Fatal(err)
			}
			want[delta.Hash(chunk)] = delta.BlobData
		}
		tree := treeOf(c.chunks[0])
		if _, err := op.SaveBlob(ctx, delta.BlobTree, delta.Hash(tree), tree); err != nil {
			t.Fatal(err)
		}
		if want[delta.Hash(tree)] == 0 {
			want[delta.Hash(tree)] = delta.BlobTree
		}
		if err := op.Publish(ctx, delta.Hash(tree)); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(op.Written()) != c.packs {
			t.Errorf("%s: %d packs written, want %d", c.name, len(op.Written()), c.packs)
		}
		for _, w := range op.Written() {
			data, err := upload.ReadAllMax(ctx, r.store, w.Name, delta.MaxPackSize)
			if err != nil {
				t.Fatal(err)
			}
			entries, err := delta.ParsePackHeader(data)
			if err != nil {
				t.Fatal(err)
			}
			sawTree := false
			for _, e := range entries {
				if e.Type == delta.BlobData && sawTree {
					t.Errorf("%s: pack %s holds a chunk after a tree", c.name, w.Name)
				}
				sawTree = sawTree || e.Type == delta.BlobTree
			}
			if c.packs == 2 && sawTree && len(entries) != 1 {
				t.Errorf("%s: the tree pack holds %d blobs, want the tree alone", c.name, len(entries))
			}
		}
		for _, chunk := range append(c.chunks, tree) {
			id := delta.Hash(chunk)
			got, err := r.LoadBlob(ctx, want[id], id)
			if err != nil || !bytes.Equal(got, chunk) {
				t.Errorf("%s: blob %s does not load back: %v", c.name, id.Short(), err)
			}
		}
	}
}
