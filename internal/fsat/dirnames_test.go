package fsat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReadDirNamesListsEveryName lists directories of no names, of a few,
// and of more than one getdents buffer holds (long names included),
// against os.ReadDir, from a descriptor read before (its offset at the
// end), and checks the descriptor's offset is left alone.
func TestReadDirNamesListsEveryName(t *testing.T) {
	for _, n := range []int{0, 3, 1500} {
		dir := t.TempDir()
		var want []string
		for i := range n {
			name := fmt.Sprintf("f%05d", i)
			if i%7 == 0 {
				name += strings.Repeat("x", 240)
			}
			if i%11 == 0 {
				name += " \n\tname"
			}
			must(t, os.WriteFile(filepath.Join(dir, name), nil, 0o644))
			want = append(want, name)
		}
		if n > 0 {
			must(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
			want = append(want, "sub")
		}
		fd, err := OpenDir(dir)
		must(t, err)
		defer unix.Close(fd)
		for pass := range 2 {
			got, err := ReadDirNames(fd)
			must(t, err)
			if got == nil {
				t.Fatal("nil names")
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("%d names, pass %d: listed %d", len(want), pass, len(got))
			}
			// A descriptor read to its end still lists from the start.
			for {
				k, err := unix.Getdents(fd, make([]byte, 4096))
				must(t, err)
				if k == 0 {
					break
				}
			}
		}
		var seen int
		stop := errors.New("stop")
		err = EachDirName(fd, make([]byte, 4096), func(name []byte) error {
			if seen++; seen == 2 {
				return stop
			}
			return nil
		})
		if n > 0 && !errors.Is(err, stop) || n == 0 && err != nil {
			t.Fatalf("%d names: EachDirName's callback error came back as %v", n, err)
		}
	}
}

// dirent encodes one linux_dirent64 record.
func dirent(name string, pad int) []byte {
	rec := make([]byte, 19+len(name)+1+pad)
	binary.NativeEndian.PutUint16(rec[16:], uint16(len(rec)))
	copy(rec[19:], name)
	return rec
}

// FuzzEachDirent feeds getdents records, well-formed and not: the walk
// never reads past the buffer, never loops, never hands over "." or ".."
// or a name with a NUL, and hands over the names of well-formed records.
func FuzzEachDirent(f *testing.F) {
	f.Add(append(append(dirent(".", 4), dirent("..", 0)...), dirent("a", 3)...))
	f.Add(dirent("name", 0)[:10])
	f.Add([]byte{0: 0, 16: 0, 17: 0, 18: 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var names []string
		err := eachDirent(b, func(name []byte) error {
			if len(name) == 0 || string(name) == "." || string(name) == ".." || slices.Contains(name, 0) {
				t.Fatalf("handed over %q", name)
			}
			names = append(names, string(name))
			return nil
		})
		if err != nil {
			return
		}
		// Re-encoded, the names walk the same.
		var again []byte
		for _, n := range names {
			again = append(again, dirent(n, 0)...)
		}
		var back []string
		if err := eachDirent(again, func(name []byte) error { back = append(back, string(name)); return nil }); err != nil || !slices.Equal(back, names) {
			t.Fatalf("re-encoded names walk as %q (%v), not %q", back, err, names)
		}
	})
}
