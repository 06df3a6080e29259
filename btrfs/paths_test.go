package btrfs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/btrfstest"
	"golang.org/x/sys/unix"
)

// TestRefPathsMatchInoPaths resolves inode paths from back references (the
// fallback for paths BTRFS_IOC_INO_PATHS cannot return) and checks them
// against the ioctl for ordinary inodes, hardlinks in one directory and
// across directories included, and that a path of about 4,100 bytes, which
// the ioctl cannot return, resolves.
func TestRefPathsMatchInoPaths(t *testing.T) {
	pool := btrfstest.Pool(t)
	sv := filepath.Join(pool, "refs")
	must(t, createSubvolume(sv))
	t.Cleanup(func() { deleteSubvolume(sv) })
	must(t, os.MkdirAll(filepath.Join(sv, "a/b"), 0o755))
	must(t, os.WriteFile(filepath.Join(sv, "a/b/f"), []byte("x"), 0o644))
	must(t, os.Link(filepath.Join(sv, "a/b/f"), filepath.Join(sv, "a/g")))
	for i := range 300 { // enough names in one directory for extended refs
		must(t, os.Link(filepath.Join(sv, "a/b/f"), filepath.Join(sv, "a/b", "link-"+strings.Repeat("n", 40)+string(rune('A'+i%26))+string(rune('a'+i/26)))))
	}
	fd, err := openDir(sv)
	must(t, err)
	defer unix.Close(fd)
	var st unix.Stat_t
	for _, rel := range []string{"a", "a/b"} {
		must(t, unix.Lstat(filepath.Join(sv, rel), &st))
		want, err := inoPaths(fd, st.Ino)
		must(t, err)
		got, err := refPaths(fd, st.Ino, map[uint64]string{}, 0)
		must(t, err)
		if !slices.Equal(got, want) {
			t.Fatalf("refPaths(%s) = %q, ioctl gives %q", rel, got, want)
		}
	}
	must(t, unix.Lstat(filepath.Join(sv, "a/b/f"), &st))
	got, err := inoPaths(fd, st.Ino) // 302 names: more than the ioctl's 4 KiB
	must(t, err)
	if len(got) != 302 || !slices.Contains(got, "a/g") || !slices.Contains(got, "a/b/f") {
		t.Fatalf("paths of a 302-name inode: %d, %q...", len(got), got[:min(3, len(got))])
	}
	// A path of about 4,100 bytes.
	cur, err := openDir(sv)
	must(t, err)
	var parts []string
	for i := range 16 {
		n := strings.Repeat(string(rune('a'+i)), 255)
		parts = append(parts, n)
		must(t, unix.Mkdirat(cur, n, 0o755))
		next, err := unix.Openat(cur, n, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		must(t, err)
		unix.Close(cur)
		cur = next
	}
	defer unix.Close(cur)
	must(t, unix.Fstat(cur, &st))
	got, err = inoPaths(fd, st.Ino)
	must(t, err)
	if want := strings.Join(parts, "/"); len(got) != 1 || got[0] != want {
		t.Fatalf("path of a %d-byte deep directory: %d bytes", len(want), len(got[0]))
	}
}
