package fsat

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestOpenNeverFollows: a symlink in any component, to inside or outside
// the root, is ELOOP; a trailing one opened O_PATH gives the link itself;
// ".." cannot climb out.
func TestOpenNeverFollows(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(root, "d/e"), 0o755))
	must(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o644))
	must(t, os.Symlink(outside, filepath.Join(root, "out")))
	must(t, os.Symlink("d", filepath.Join(root, "in")))
	fd, err := OpenDir(root)
	must(t, err)
	defer unix.Close(fd)
	for _, rel := range []string{"out/secret", "in/e", "out", "../" + filepath.Base(root)} {
		if g, err := Open(fd, rel, unix.O_RDONLY); err == nil {
			unix.Close(g)
			t.Errorf("Open(%q) followed a link or left the root", rel)
		} else if !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.EXDEV) {
			t.Errorf("Open(%q): %v, want ELOOP or EXDEV", rel, err)
		}
	}
	var st unix.Stat_t
	must(t, Lstat(fd, "out", &st))
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		t.Fatalf("Lstat of a symlink gave mode %o", st.Mode)
	}
	if target, err := Readlink(fd, "out"); err != nil || target != outside {
		t.Fatalf("Readlink = %q, %v", target, err)
	}
}

// TestOpenLongPaths walks paths longer than one path argument.
func TestOpenLongPaths(t *testing.T) {
	root := t.TempDir()
	fd, err := OpenDir(root)
	must(t, err)
	defer unix.Close(fd)
	cur, err := unix.Dup(fd)
	must(t, err)
	var parts []string
	for i := range 24 {
		n := strings.Repeat(string(rune('a'+i)), 250)
		parts = append(parts, n)
		must(t, unix.Mkdirat(cur, n, 0o755))
		next, err := unix.Openat(cur, n, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		must(t, err)
		unix.Close(cur)
		cur = next
	}
	unix.Close(cur)
	rel := strings.Join(parts, "/")
	d, err := Open(fd, rel, unix.O_RDONLY|unix.O_DIRECTORY)
	must(t, err)
	unix.Close(d)
	p, name, err := OpenParent(fd, rel)
	must(t, err)
	defer unix.Close(p)
	if name != parts[len(parts)-1] {
		t.Fatalf("OpenParent name %q", name)
	}
	must(t, os.Symlink("/", filepath.Join(root, parts[0], "evil")))
	if _, err := Open(fd, parts[0]+"/evil/"+strings.Join(parts[1:], "/"), unix.O_RDONLY); !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.ENOTDIR) {
		t.Fatalf("long path through a symlink: %v, want ELOOP or ENOTDIR", err)
	}
}

// WriteFileDurable leaves the new content whole, no temporary file, and
// replaces an existing file.
func TestWriteFileDurable(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	for _, body := range []string{"one\n", "two, longer\n", ""} {
		if err := WriteFileDurable(p, body); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != body {
			t.Fatalf("after writing %q: %q, %v", body, got, err)
		}
		if _, err := os.Stat(p + ".tmp"); !os.IsNotExist(err) {
			t.Fatalf("temporary file left: %v", err)
		}
	}
	if err := WriteFileDurable(filepath.Join(t.TempDir(), "no", "dir"), "x"); err == nil {
		t.Fatal("a write into a missing directory succeeded")
	}
}
