package fsat

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestXattrsValuesAreTheirOwn: the values Xattrs returns are read through
// the caller's scratch buffer, one after the other, so each must be a copy
// (a later value must not overwrite an earlier one), and a scratch buffer
// shorter than a value must still work.
func TestXattrsValuesAreTheirOwn(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("v"), 3000) // past the short buffer, within ext4's block
	want := map[string][]byte{"user.a": []byte("first"), "user.b": big, "user.c": []byte("third, short")}
	for k, v := range want {
		if err := unix.Setxattr(p, k, v, 0); err != nil {
			t.Fatalf("user xattr on %s: %v", dir, err)
		}
	}
	fd, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, size := range []int{XattrBufSize, 1 << 10} {
		by, err := Xattrs(fd, "f", make([]byte, size), nil)
		if err != nil {
			t.Fatalf("Xattrs (buffer %d): %v", size, err)
		}
		byFD, err := XattrsFD(int(f.Fd()), make([]byte, size), nil)
		if err != nil {
			t.Fatalf("XattrsFD (buffer %d): %v", size, err)
		}
		for _, got := range [][]Xattr{by, byFD} {
			if len(got) != len(want) {
				t.Fatalf("buffer %d: %d xattrs, want %d", size, len(got), len(want))
			}
			for _, x := range got {
				if !bytes.Equal(x.Value, want[x.Name]) {
					t.Errorf("buffer %d: %s is %d bytes %.12q, want %d bytes %.12q", size, x.Name, len(x.Value), x.Value, len(want[x.Name]), want[x.Name])
				}
			}
		}
	}
	if xs, err := Xattrs(fd, "f", make([]byte, XattrBufSize), func(n string) bool { return n != "user.c" }); err != nil || len(xs) != 1 || xs[0].Name != "user.c" {
		t.Fatalf("skip kept %v, %v; want user.c alone", xs, err)
	}
}

// BenchmarkXattrs reads the xattrs of a file with one, as a scan does for
// every entry it looks at; -benchmem shows what one read allocates.
func BenchmarkXattrs(b *testing.B) {
	dir := b.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		b.Fatal(err)
	}
	if err := unix.Setxattr(p, "user.k", []byte("value"), 0); err != nil {
		b.Fatal(err)
	}
	fd, err := OpenDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fd)
	buf := make([]byte, XattrBufSize)
	b.ReportAllocs()
	for b.Loop() {
		if xs, err := Xattrs(fd, "f", buf, nil); err != nil || len(xs) != 1 {
			b.Fatal(xs, err)
		}
	}
}
