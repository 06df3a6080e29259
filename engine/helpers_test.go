package engine

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/upload"
	"golang.org/x/sys/unix"
)

// These tests need root and overlayfs: they mount real sandboxes.

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// openEngine opens an engine on home and, at cleanup, removes every sandbox
// (unmounting it) so the temp dir can be deleted.
func openEngine(t testing.TB, home string) *Engine {
	t.Helper()
	testenv.RequireRoot(t)
	e, err := Open(context.Background(), Options{Home: home})
	must(t, err)
	t.Cleanup(func() {
		if e.cat != nil {
			sbs, _ := e.ListSandboxes(context.Background())
			for _, s := range sbs {
				e.RemoveSandbox(context.Background(), s.Sandbox.Name)
			}
		}
		e.Close()
	})
	return e
}

func newEngine(t testing.TB) *Engine { return openEngine(t, filepath.Join(t.TempDir(), "home")) }

func write(t testing.TB, p, content string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, []byte(content), 0o644))
}

// richBase builds a base with every kind of entry the format records.
func richBase(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	write(t, filepath.Join(dir, "src/main.go"), "package main\n")
	write(t, filepath.Join(dir, "src/lib/a.go"), "package lib\n")
	write(t, filepath.Join(dir, "src/lib/b.go"), "package lib // b\n")
	write(t, filepath.Join(dir, "etc/config"), "port=1\n")
	write(t, filepath.Join(dir, "doomed/x"), "x\n")
	write(t, filepath.Join(dir, "doomed/y"), "y\n")
	must(t, os.MkdirAll(filepath.Join(dir, "tmp"), 0o1777))
	must(t, os.Chmod(filepath.Join(dir, "tmp"), 0o1777))
	must(t, os.Symlink("main.go", filepath.Join(dir, "src/link")))
	must(t, unix.Setxattr(filepath.Join(dir, "etc/config"), "user.origin", []byte("base"), 0))
	return dir
}

// mergedState hashes everything a process in the sandbox sees (the
// conformance suite's oracle): equal hashes, same filesystem.
func mergedState(t testing.TB, root string) delta.ID { return roottest.Merged(t, root) }

// settle waits out the racy window so the next scan may trust its cache.
func settle() { time.Sleep(60 * time.Millisecond) }

func countObjects(t testing.TB, s upload.Store) int {
	t.Helper()
	n := 0
	must(t, s.List(context.Background(), "", func(upload.ObjectInfo) error { n++; return nil }))
	return n
}
