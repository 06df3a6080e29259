package overlay

import (
	"bufio"
	"context"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/roottest"
)

// The memo serves a cache only while its file is the one it came from: a
// cache another process wrote in its place is read again.
func TestCacheMemoFollowsTheFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "scan.cache")
	write := func(paths ...string) *fstree.ScanCache {
		t.Helper()
		dir := t.TempDir()
		for _, rel := range paths {
			roottest.Write(t, filepath.Join(dir, rel), rel)
		}
		res, err := fstree.Scan(context.Background(), dir, fstree.ScanOptions{})
		must(t, err)
		c := res.Cache
		must(t, writeCacheFile(p, func(w *bufio.Writer) error { return fstree.WriteCache(w, c) }))
		return c
	}
	m := newCacheMemo()
	a := write("a")
	m.wrote(p, a)
	if got := m.read(p); got != a {
		t.Fatal("the memo did not serve the cache it just recorded")
	}
	write("b", "c") // another process's turn: a new file in its place
	got := m.read(p)
	if got == a || got == nil || got.Len() != 2 {
		t.Fatalf("after the file was replaced the memo served %v", got)
	}
	if again := m.read(p); again != got {
		t.Fatal("the re-read cache was not kept")
	}
}
