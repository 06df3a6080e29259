package overlay

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/roottest"
)

func ino(t *testing.T, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	must(t, syscall.Lstat(p, &st))
	return st.Ino
}

// commit scans r into store and commits the scan, as a checkpoint does.
func commit(t *testing.T, r *Root, store delta.BlobSaver) *fstree.ScanResult {
	t.Helper()
	res, err := r.Scan(context.Background(), store)
	must(t, err)
	must(t, r.Committed(res))
	return res
}

// Restore applies a diff when it can (same inodes, no fallback) and
// rebuilds the layer whole for a renamed base directory (overlay's
// redirects); either way the result is the target state. (A layer that
// does not mount: TestMountOnAnotherBaseCopyIsRefused.)
func TestRestoreByDiffAndItsFallbacks(t *testing.T) {
	ctx := context.Background()
	r, _, _ := newRoot(t, func(lower string) {
		roottest.Write(t, filepath.Join(lower, "pkg/mod.go"), "package pkg\n")
		roottest.Write(t, filepath.Join(lower, "f"), "base\n")
	})
	store := roottest.NewMemStore()
	p := func(rel string) string { return filepath.Join(r.Path(), rel) }
	roottest.Write(t, p("app.db"), "one\n")
	roottest.Settle()
	a := commit(t, r, store)
	want := roottest.Merged(t, r.Path())
	before := ino(t, p("app.db"))
	f, err := os.OpenFile(p("app.db"), os.O_WRONLY|os.O_TRUNC, 0)
	must(t, err)
	f.WriteString("two, longer\n")
	must(t, f.Close())
	roottest.Settle()
	commit(t, r, store)

	must(t, r.Restore(ctx, a.Root, store))
	if r.lastFallback != "" {
		t.Fatalf("a two-name diff was rebuilt: %s", r.lastFallback)
	}
	if got := roottest.Merged(t, r.Path()); got != want || ino(t, p("app.db")) != before {
		t.Fatalf("diff restore: state %v, inode kept %v", got == want, ino(t, p("app.db")) == before)
	}

	// A renamed base directory is a redirect in the upper: rebuilt.
	must(t, os.Rename(p("pkg"), p("pkg2")))
	must(t, r.Restore(ctx, a.Root, store))
	if !strings.Contains(r.lastFallback, "renamed base directory") {
		t.Fatalf("restore over a redirect: fallback %q", r.lastFallback)
	}
	if got := roottest.Merged(t, r.Path()); got != want {
		t.Fatal("the rebuilt layer is not the target state")
	}
}
