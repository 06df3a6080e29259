package fstree

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
)

// countingLoader counts the data blobs loaded through it.
type countingLoader struct {
	*memBlobs
	data atomic.Int64
}

func (c *countingLoader) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	if t == delta.BlobData {
		c.data.Add(1)
	}
	return c.memBlobs.LoadBlob(ctx, t, id)
}

// TestMaterialiseFromSource: with a Source, files that still match their
// entries are copied from the scanned directory (no data blob is loaded)
// and the result scans back to the tree; a file of another size comes
// from the store; a file rewritten with the same size is copied as it now
// is, so the result no longer scans to the tree: the caller's verify is
// what catches it (PrepareBase does), as Source's contract says.
func TestMaterialiseFromSource(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	src := t.TempDir()
	files := map[string]string{"a.txt": "alpha\n", "d/b.txt": strings.Repeat("bravo ", 5000), "d/e/c.bin": strings.Repeat("\x01\x02", 70000)}
	for rel, body := range files {
		must(t, os.MkdirAll(filepath.Dir(filepath.Join(src, rel)), 0o755))
		must(t, os.WriteFile(filepath.Join(src, rel), []byte(body), 0o640))
	}
	must(t, os.Symlink("d/b.txt", filepath.Join(src, "link")))
	mem := newMem()
	res, err := Scan(ctx, src, ScanOptions{Saver: mem, Quiescent: true})
	must(t, err)
	materialise := func() (delta.ID, int64) {
		t.Helper()
		l := &countingLoader{memBlobs: mem}
		dst := t.TempDir()
		_, err := Materialise(ctx, res.Root, dst, ApplyOptions{Loader: Source{BlobLoader: l, Dir: src}, Plain: true})
		must(t, err)
		got, err := Scan(ctx, dst, ScanOptions{Quiescent: true})
		must(t, err)
		return got.Root, l.data.Load()
	}
	if root, loads := materialise(); root != res.Root || loads != 0 {
		t.Fatalf("from an unchanged source: tree %s (want %s), %d data blobs loaded (want 0)", root.Short(), res.Root.Short(), loads)
	}
	must(t, os.WriteFile(filepath.Join(src, "d/b.txt"), []byte("shorter now\n"), 0o640))
	if root, loads := materialise(); root != res.Root || loads == 0 {
		t.Fatalf("a source file of another size: tree %s (want %s), %d data blobs loaded (want some)", root.Short(), res.Root.Short(), loads)
	}
	must(t, os.WriteFile(filepath.Join(src, "a.txt"), []byte("ALPHA\n"), 0o640))
	if root, _ := materialise(); root == res.Root {
		t.Fatal("a source file rewritten with its size: the copy scanned to the tree; the test cannot see what verify must catch")
	}
}
