package fstree

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestUnchangedNoticesEveryChange: a directory checked against the cache
// of its own quiescent scan is unchanged, and any change a scan would see
// makes it changed: content rewritten in place with its mtime put back,
// a mode, an owner, an xattr, a name added, removed or renamed deep down,
// a directory swapped for a symlink, a new hardlink. A cache of racy
// entries is never trusted.
func TestUnchangedNoticesEveryChange(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	old := time.Date(2021, 3, 4, 5, 6, 7, 0, time.UTC)
	build := func(t *testing.T) string {
		dir := t.TempDir()
		for _, p := range []string{"a/b/c/f", "a/b/g", "a/h", "top"} {
			must(t, os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755))
			must(t, os.WriteFile(filepath.Join(dir, p), []byte("content of "+p), 0o644))
			must(t, os.Chtimes(filepath.Join(dir, p), old, old))
		}
		must(t, os.Symlink("a/h", filepath.Join(dir, "link")))
		// Stamped long before the scan: nothing is racy.
		return dir
	}
	p := func(dir, rel string) string { return filepath.Join(dir, rel) }
	for _, tc := range []struct {
		name   string
		change func(dir string) error
	}{
		{"content rewritten, mtime put back", func(d string) error {
			if err := os.WriteFile(p(d, "a/b/c/f"), []byte("CONTENT OF a/b/c/f"), 0o644); err != nil {
				return err
			}
			return os.Chtimes(p(d, "a/b/c/f"), old, old)
		}},
		{"a mode", func(d string) error { return os.Chmod(p(d, "a/b/g"), 0o600) }},
		{"an owner", func(d string) error { return os.Lchown(p(d, "a/h"), 7, 7) }},
		{"an xattr on a directory", func(d string) error { return unix.Setxattr(p(d, "a/b"), "user.x", []byte("1"), 0) }},
		{"a name added deep down", func(d string) error { return os.WriteFile(p(d, "a/b/c/new"), nil, 0o644) }},
		{"a name removed deep down", func(d string) error { return os.Remove(p(d, "a/b/c/f")) }},
		{"a name removed at the top", func(d string) error { return os.Remove(p(d, "top")) }},
		{"a name renamed", func(d string) error { return os.Rename(p(d, "a/b/g"), p(d, "a/b/g2")) }},
		{"a directory swapped for a symlink", func(d string) error {
			if err := os.Rename(p(d, "a/b"), p(d, "moved")); err != nil {
				return err
			}
			return os.Symlink("../moved", p(d, "a/b"))
		}},
		{"a new hardlink", func(d string) error { return os.Link(p(d, "top"), p(d, "a/top2")) }},
		{"a symlink retargeted", func(d string) error {
			if err := os.Remove(p(d, "link")); err != nil {
				return err
			}
			return os.Symlink("a/b/g", p(d, "link"))
		}},
	} {
		dir := build(t)
		res, err := Scan(ctx, dir, ScanOptions{Quiescent: true})
		must(t, err)
		if !res.Cache.Unchanged(ctx, dir) {
			t.Fatalf("%s: the directory is changed before the change", tc.name)
		}
		must(t, tc.change(dir))
		if res.Cache.Unchanged(ctx, dir) {
			t.Errorf("%s: not noticed", tc.name)
		}
		again, err := Scan(ctx, dir, ScanOptions{Quiescent: true, Prev: res.Cache})
		must(t, err)
		if again.Root == res.Root {
			t.Fatalf("%s: a scan hashes as before: no damage to notice", tc.name)
		}
	}
	dir := build(t)
	must(t, os.WriteFile(p(dir, "fresh"), nil, 0o644)) // just now: racy
	res, err := Scan(ctx, dir, ScanOptions{})
	must(t, err)
	if res.Cache.Unchanged(ctx, dir) {
		t.Fatal("a cache with racy entries is trusted")
	}
	var none *ScanCache
	if none.Unchanged(ctx, dir) {
		t.Fatal("no cache is trusted")
	}
}
