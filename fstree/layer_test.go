package fstree

import (
	"context"
	"errors"
	"github.com/turnsnap/turnsnap/delta"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

// layerBase builds a lower directory for the ApplyLayer tests.
func layerBase(t *testing.T, dir string) {
	t.Helper()
	for _, f := range []string{"keep/a", "keep/b", "gone/x", "replaced/x", "file-to-dir", "d/sub/deep", "links/one"} {
		must(t, os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755))
		must(t, os.WriteFile(filepath.Join(dir, f), []byte("base "+f), 0o644))
	}
	must(t, os.Mkdir(filepath.Join(dir, "dir-to-file"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "dir-to-file/x"), []byte("x"), 0o644))
	must(t, unix.Setxattr(filepath.Join(dir, "keep"), "user.dir", []byte("base"), 0))
	must(t, os.Symlink("keep", filepath.Join(dir, "sym")))
}

// TestApplyLayerMergesLikeOverlayfs writes an overlay upper layer onto a
// copy of its lower directory and checks the result against what the
// kernel's overlayfs shows for the same lower and upper.
func TestApplyLayerMergesLikeOverlayfs(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	tmp := t.TempDir()
	lower, upper, work, merged := filepath.Join(tmp, "lower"), filepath.Join(tmp, "upper"), filepath.Join(tmp, "work"), filepath.Join(tmp, "merged")
	for _, d := range []string{lower, upper, work, merged} {
		must(t, os.Mkdir(d, 0o755))
	}
	layerBase(t, lower)
	// The upper layer, in overlayfs's own on-disk form.
	up := func(rel string) string { return filepath.Join(upper, rel) }
	must(t, os.MkdirAll(up("keep"), 0o700)) // merged dir: new mode, xattr dropped
	must(t, os.WriteFile(up("keep/b"), []byte("changed"), 0o600))
	must(t, os.WriteFile(up("keep/new"), []byte("new"), 0o644))
	must(t, os.Link(up("keep/new"), up("keep/new-link")))
	must(t, unix.Mknod(up("gone"), unix.S_IFCHR, 0)) // whiteout of a directory
	must(t, os.Mkdir(up("replaced"), 0o755))         // opaque: lower x hidden
	must(t, unix.Setxattr(up("replaced"), OpaqueXattr, []byte("y"), 0))
	must(t, os.WriteFile(up("replaced/y"), []byte("y"), 0o644))
	must(t, os.Mkdir(up("file-to-dir"), 0o755))
	must(t, unix.Setxattr(up("file-to-dir"), OpaqueXattr, []byte("y"), 0))
	must(t, os.WriteFile(up("dir-to-file"), []byte("now a file"), 0o644))
	must(t, os.Symlink("../elsewhere", up("sym2")))
	must(t, os.MkdirAll(up("d/sub"), 0o755))
	must(t, unix.Mknod(up("d/sub/deep"), unix.S_IFCHR, 0))
	must(t, unix.Setxattr(up("keep/new"), "user.k", []byte("v"), 0))
	old := time.Date(2022, 2, 3, 4, 5, 6, 7, time.UTC)
	must(t, os.Chtimes(up("keep"), old, old))
	must(t, os.Chtimes(up("d/sub"), old, old))

	store := newMem()
	res, err := Scan(ctx, upper, ScanOptions{Saver: store, Translate: overlayish})
	must(t, err)
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	must(t, unix.Mount("overlay", merged, "overlay", 0, opts))
	want, err := Scan(ctx, merged, ScanOptions{})
	unix.Unmount(merged, 0)
	must(t, err)

	// The same layer applied onto an exact copy of the lower directory.
	dst := filepath.Join(tmp, "dst")
	must(t, os.Mkdir(dst, 0o755))
	lres, err := Scan(ctx, lower, ScanOptions{Saver: store})
	must(t, err)
	_, err = Materialise(ctx, lres.Root, dst, ApplyOptions{Loader: store})
	must(t, err)
	if _, err := ApplyLayer(ctx, res.Root, dst, ApplyOptions{Loader: store}); err != nil {
		t.Fatal(err)
	}
	got, err := Scan(ctx, dst, ScanOptions{})
	must(t, err)
	if got.Root != want.Root {
		t.Fatalf("applied layer hashes to %s, overlayfs shows %s", got.Root.Short(), want.Root.Short())
	}
}

// TestApplyLayerNeverFollowsSymlinks puts symlinks to an outside directory
// where the layer has directories, files and whiteouts; nothing outside may
// change.
func TestApplyLayerNeverFollowsSymlinks(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	tmp := t.TempDir()
	outside := filepath.Join(tmp, "outside")
	must(t, os.MkdirAll(filepath.Join(outside, "x"), 0o755))
	must(t, os.WriteFile(filepath.Join(outside, "victim"), []byte("keep me"), 0o644))
	before, err := Scan(ctx, outside, ScanOptions{})
	must(t, err)

	// The layer: dir "d" with a file, dir "e/f" with a file, a whiteout of
	// "w", and file "v".
	src := filepath.Join(tmp, "src")
	must(t, os.MkdirAll(filepath.Join(src, "d"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "d/victim"), []byte("overwritten"), 0o644))
	must(t, os.MkdirAll(filepath.Join(src, "e/x"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "e/x/new"), []byte("n"), 0o644))
	must(t, unix.Mknod(filepath.Join(src, "w"), unix.S_IFCHR, 0))
	must(t, os.WriteFile(filepath.Join(src, "v"), []byte("v"), 0o644))
	store := newMem()
	res, err := Scan(ctx, src, ScanOptions{Saver: store, Translate: overlayish})
	must(t, err)

	dst := filepath.Join(tmp, "dst")
	must(t, os.MkdirAll(filepath.Join(dst, "e"), 0o755))
	must(t, os.Symlink(outside, filepath.Join(dst, "d")))
	must(t, os.Symlink(outside, filepath.Join(dst, "e/x")))
	must(t, os.Symlink(outside, filepath.Join(dst, "w")))
	must(t, os.Symlink(filepath.Join(outside, "victim"), filepath.Join(dst, "v")))
	if _, err := ApplyLayer(ctx, res.Root, dst, ApplyOptions{Loader: store}); err != nil {
		t.Fatal(err)
	}
	after, err := Scan(ctx, outside, ScanOptions{})
	must(t, err)
	if after.Root != before.Root {
		t.Fatal("applying the layer changed a directory outside dst")
	}
	var st unix.Stat_t
	for _, p := range []string{"d", "e/x"} {
		if err := unix.Lstat(filepath.Join(dst, p), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			t.Fatalf("%s is not a real directory after apply", p)
		}
	}
	if unix.Lstat(filepath.Join(dst, "w"), &st) == nil {
		t.Fatal("the whiteout left its name")
	}
	if data, err := os.ReadFile(filepath.Join(dst, "v")); err != nil || string(data) != "v" {
		t.Fatalf("v = %q, %v", data, err)
	}
}

func TestApplyLayerRefusesDevicesAndCorruption(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	tmp := t.TempDir()
	src := filepath.Join(tmp, "src")
	must(t, os.Mkdir(src, 0o755))
	must(t, unix.Mknod(filepath.Join(src, "sda"), unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0))))
	store := newMem()
	res, err := Scan(ctx, src, ScanOptions{Saver: store})
	must(t, err)
	dst := filepath.Join(tmp, "dst")
	must(t, os.Mkdir(dst, 0o755))
	if _, err := ApplyLayer(ctx, res.Root, dst, ApplyOptions{Loader: store}); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("device node applied without AllowDevices: %v", err)
	}

	must(t, os.Remove(filepath.Join(src, "sda")))
	must(t, os.WriteFile(filepath.Join(src, "f"), []byte("content"), 0o644))
	res, err = Scan(ctx, src, ScanOptions{Saver: store})
	must(t, err)
	store.m[delta.Hash([]byte("content"))] = []byte("tampered")
	dst2 := filepath.Join(tmp, "dst2")
	must(t, os.Mkdir(dst2, 0o755))
	if _, err := ApplyLayer(ctx, res.Root, dst2, ApplyOptions{Loader: store}); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("corrupt chunk applied: %v", err)
	}
}
