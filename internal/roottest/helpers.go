package roottest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"golang.org/x/sys/unix"
)

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// fixture is a base imported into a store and prepared by the backend.
type fixture struct {
	t     *testing.T
	s     Setup
	ctx   context.Context
	store *MemStore
	base  string   // the base directory on disk
	tree  delta.ID // its tree
	lower string   // what PrepareBase returned
}

func newFixture(t *testing.T, s Setup) *fixture {
	t.Helper()
	f := &fixture{t: t, s: s, ctx: context.Background(), store: NewMemStoreIDs(s.IDs), base: RichBase(t)}
	res, err := fstree.Scan(f.ctx, f.base, fstree.ScanOptions{Saver: f.store, IDs: f.s.IDs})
	must(t, err)
	f.tree = res.Root
	f.lower, err = s.Backend.PrepareBase(f.ctx, f.tree, f.store)
	must(t, err)
	return f
}

// create makes a root named name with layer tree, removed at cleanup.
func (f *fixture) create(name string, tree delta.ID) (rootfs.Root, string) {
	f.t.Helper()
	dir := filepath.Join(f.t.TempDir(), name)
	r, err := f.s.Backend.Create(f.ctx, dir, f.lower, tree, f.store)
	must(f.t, err)
	f.t.Cleanup(func() { f.s.Backend.Open(dir, f.lower).Remove(context.Background()) })
	return r, dir
}

// checkpoint scans r into the store and commits the scan.
func (f *fixture) checkpoint(r rootfs.Root) *fstree.ScanResult {
	f.t.Helper()
	res, err := r.Scan(f.ctx, f.store)
	must(f.t, err)
	must(f.t, r.Committed(res))
	return res
}

// Merged hashes everything a process in the root sees: contents, modes,
// ownership, xattrs, mtimes of files and directories, symlinks and
// hardlinks. Two roots with equal hashes hold the same filesystem.
func Merged(t testing.TB, root string) delta.ID {
	t.Helper()
	res, err := fstree.Scan(context.Background(), root, fstree.ScanOptions{})
	must(t, err)
	return res.Root
}

// Write creates p (and its parents) with content.
func Write(t testing.TB, p, content string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, []byte(content), 0o644))
}

// Settle waits out the racy window of scan caches (fstree.RacyWindow, so
// the two cannot drift apart), so the next scan may trust what the
// previous one saw. A wait on the clock, not a guess: a scan trusts only
// entries whose ctime is older than the window, and that age is what is
// waited for; the margin covers the coarse timestamp clock's tick.
func Settle() { time.Sleep(fstree.RacyWindow + 10*time.Millisecond) }

// RichBase builds a base with every kind of entry the format records,
// hardlinks included.
func RichBase(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	Write(t, filepath.Join(dir, "src/main.go"), "package main\n")
	Write(t, filepath.Join(dir, "src/lib/a.go"), "package lib\n")
	Write(t, filepath.Join(dir, "src/lib/b.go"), "package lib // b\n")
	Write(t, filepath.Join(dir, "etc/config"), "port=1\n")
	Write(t, filepath.Join(dir, "doomed/x"), "x\n")
	Write(t, filepath.Join(dir, "doomed/y"), "y\n")
	Write(t, filepath.Join(dir, "deep/a/b/c/file"), "deep\n")
	Write(t, filepath.Join(dir, "links/one"), "linked\n")
	must(t, os.Link(filepath.Join(dir, "links/one"), filepath.Join(dir, "links/two")))
	must(t, os.MkdirAll(filepath.Join(dir, "tmp"), 0o1777))
	must(t, os.Chmod(filepath.Join(dir, "tmp"), 0o1777))
	must(t, os.Symlink("main.go", filepath.Join(dir, "src/link")))
	must(t, unix.Setxattr(filepath.Join(dir, "etc/config"), "user.origin", []byte("base"), 0))
	return dir
}

// AgentTurn changes root in every way the format must capture.
func AgentTurn(t testing.TB, root string) {
	t.Helper()
	p := func(rel string) string { return filepath.Join(root, rel) }
	Write(t, p("src/main.go"), "package main\n\nfunc main() { println(1) }\n")
	Write(t, p("src/new/deep/file.txt"), strings.Repeat("new content\n", 5000))
	must(t, os.Remove(p("src/lib/b.go")))             // whiteout
	must(t, os.RemoveAll(p("doomed")))                // whiteout of a dir ...
	must(t, os.Mkdir(p("doomed"), 0o700))             // ... recreated: opaque
	Write(t, p("doomed/only"), "fresh\n")             //
	must(t, os.Chmod(p("etc/config"), 0o600))         // mode of a base file
	must(t, os.Lchown(p("src/lib/a.go"), 1001, 1002)) // ownership
	must(t, unix.Setxattr(p("src/main.go"), "user.k", []byte("v"), 0))
	must(t, os.Symlink("/etc/passwd", p("src/abs-link"))) // symlink out of root
	must(t, os.Link(p("src/main.go"), p("src/hard.go")))
	Move(t, p("deep/a"), p("moved"))          // a base directory renamed
	Move(t, p("links/two"), p("links/three")) // one name of a base hardlink
	old := time.Date(2021, 5, 6, 7, 8, 9, 123456789, time.UTC)
	must(t, os.Chtimes(p("src/new/deep"), old, old)) // directory mtime
	must(t, os.Chtimes(p("src/new/deep/file.txt"), old, old))
	must(t, os.Chtimes(p("tmp"), old, old)) // a base directory's mtime alone
}

// Move renames src to dst the way mv does (rename(2), which overlay roots
// allow for base directories too: they mount with redirect_dir=on).
func Move(t testing.TB, src, dst string) {
	t.Helper()
	if out, err := exec.Command("mv", "-T", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("mv %s %s: %v: %s", src, dst, err, out)
	}
}

// entryAt returns the layer entry at rel, or nil.
func (f *fixture) entryAt(tree delta.ID, rel string) *delta.Entry {
	f.t.Helper()
	var e *delta.Entry
	for _, part := range strings.Split(rel, "/") {
		data, err := f.store.LoadBlob(f.ctx, delta.BlobTree, tree)
		must(f.t, err)
		tr, err := delta.DecodeTree(data)
		must(f.t, err)
		if e = tr.Find(part); e == nil {
			return nil
		}
		tree = e.Subtree
	}
	return e
}

// mounts counts the mounts on p.
func mounts(t testing.TB, p string) int {
	t.Helper()
	ms, err := mountinfo.GetMounts(func(m *mountinfo.Info) (bool, bool) { return m.Mountpoint != p, false })
	must(t, err)
	return len(ms)
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
