package basewatch_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/overlay"
	"github.com/turnsnap/turnsnap/overlay/basewatch"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// base writes a small tree: files at the top and three directories down.
func base(t *testing.T) string {
	root := filepath.Join(t.TempDir(), "base")
	for _, p := range []string{"README", "a/b/c/deep.txt", "a/b/mid.txt", "d/e.txt"} {
		must(t, os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755))
		must(t, os.WriteFile(filepath.Join(root, p), []byte(p+"\n"), 0o644))
	}
	return root
}

// Every kind of change anywhere below the base makes a fresh watch dirty,
// and stays dirty; reading, listing and stat-ing do not.
func TestEveryChangeMakesTheWatchDirty(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	changes := map[string]func(t *testing.T, root string){
		"write":     func(t *testing.T, r string) { appendTo(t, filepath.Join(r, "a/b/c/deep.txt")) },
		"truncate":  func(t *testing.T, r string) { must(t, os.Truncate(filepath.Join(r, "d/e.txt"), 1)) },
		"chmod":     func(t *testing.T, r string) { must(t, os.Chmod(filepath.Join(r, "a/b/mid.txt"), 0o600)) },
		"chown":     func(t *testing.T, r string) { must(t, os.Lchown(filepath.Join(r, "README"), 1, 1)) },
		"mtime":     func(t *testing.T, r string) { touch(t, filepath.Join(r, "a/b/c/deep.txt")) },
		"dir mtime": func(t *testing.T, r string) { touch(t, filepath.Join(r, "a/b")) },
		"xattr": func(t *testing.T, r string) {
			must(t, unix.Lsetxattr(filepath.Join(r, "d/e.txt"), "user.x", []byte("1"), 0))
		},
		"create": func(t *testing.T, r string) { must(t, os.WriteFile(filepath.Join(r, "a/b/c/new"), nil, 0o644)) },
		"unlink": func(t *testing.T, r string) { must(t, os.Remove(filepath.Join(r, "a/b/c/deep.txt"))) },
		"rename in": func(t *testing.T, r string) {
			must(t, os.Rename(filepath.Join(r, "d/e.txt"), filepath.Join(r, "a/e.txt")))
		},
		"rename out": func(t *testing.T, r string) {
			must(t, os.Rename(filepath.Join(r, "d"), filepath.Join(r, "..", "d-out")))
		},
		"mkdir":       func(t *testing.T, r string) { must(t, os.Mkdir(filepath.Join(r, "a/b/c/sub"), 0o755)) },
		"rmdir":       func(t *testing.T, r string) { must(t, os.RemoveAll(filepath.Join(r, "a/b/c"))) },
		"hardlink in": func(t *testing.T, r string) { must(t, os.Link(filepath.Join(r, "README"), filepath.Join(r, "d/link"))) },
		"symlink":     func(t *testing.T, r string) { must(t, os.Symlink("x", filepath.Join(r, "a/sym"))) },
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			root := base(t)
			w, err := basewatch.Arm(ctx, root)
			must(t, err)
			defer w.Close()
			if w.Dirs() != 5 {
				t.Fatalf("marked %d directories, want 5", w.Dirs())
			}
			if w.Dirty() {
				t.Fatal("dirty before any change")
			}
			change(t, root)
			if !w.Dirty() {
				t.Fatalf("%s below the base: the watch is clean", name)
			}
			if !w.Dirty() {
				t.Fatalf("%s below the base: the watch was dirty, then clean again", name)
			}
		})
	}
}

// A write through a descriptor opened before the watch was armed is seen.
func TestWriteThroughAnEarlierDescriptor(t *testing.T) {
	testenv.RequireRoot(t)
	root := base(t)
	f, err := os.OpenFile(filepath.Join(root, "a/b/mid.txt"), os.O_WRONLY, 0)
	must(t, err)
	defer f.Close()
	w, err := basewatch.Arm(context.Background(), root)
	must(t, err)
	defer w.Close()
	_, err = f.WriteAt([]byte("X"), 0)
	must(t, err)
	if !w.Dirty() {
		t.Fatal("a write through a descriptor opened before Arm left the watch clean")
	}
}

// What sandboxes do to the base through their overlay roots (read, list,
// exec, and writes, which copy the file up) leaves it clean: the base is
// the overlay's lower, which overlay never writes.
func TestOverlayUseLeavesTheWatchClean(t *testing.T) {
	testenv.RequireRoot(t)
	root := base(t)
	dir := t.TempDir()
	upper, work, mnt := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "mnt")
	for _, p := range []string{upper, work, mnt} {
		must(t, os.Mkdir(p, 0o755))
	}
	w, err := basewatch.Arm(context.Background(), root)
	must(t, err)
	defer w.Close()
	opts, err := overlay.MountOptions(root, upper, work)
	must(t, err)
	must(t, unix.Mount("overlay", mnt, "overlay", 0, opts))
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	if _, err := os.ReadFile(filepath.Join(mnt, "a/b/c/deep.txt")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadDir(filepath.Join(mnt, "a/b")); err != nil {
		t.Fatal(err)
	}
	appendTo(t, filepath.Join(mnt, "a/b/mid.txt"))                            // copy-up
	must(t, os.Chmod(filepath.Join(mnt, "d/e.txt"), 0o600))                   // metadata copy-up
	must(t, os.Remove(filepath.Join(mnt, "README")))                          // whiteout
	must(t, os.WriteFile(filepath.Join(mnt, "a/new"), nil, 0o644))            // new in a merged directory
	must(t, os.Rename(filepath.Join(mnt, "a/b/c"), filepath.Join(mnt, "c2"))) // a lower directory renamed
	if w.Dirty() {
		t.Fatal("a sandbox's use of its overlay root made the base's watch dirty")
	}
	// The control: the base itself written.
	appendTo(t, filepath.Join(root, "a/b/mid.txt"))
	if !w.Dirty() {
		t.Fatal("a write to the base left the watch clean")
	}
}

// A closed watch is dirty: nothing is known any more.
func TestClosedWatchIsDirty(t *testing.T) {
	testenv.RequireRoot(t)
	w, err := basewatch.Arm(context.Background(), base(t))
	must(t, err)
	must(t, w.Close())
	if !w.Dirty() {
		t.Fatal("a closed watch is clean")
	}
	must(t, w.Close())
}

func appendTo(t *testing.T, p string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = f.Write([]byte("more\n"))
	must(t, err)
	must(t, f.Close())
}

func touch(t *testing.T, p string) {
	t.Helper()
	at := time.Unix(1_700_000_000, 0)
	must(t, os.Chtimes(p, at, at))
}
