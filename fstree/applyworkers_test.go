package fstree

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

// buildWide writes dirs directories of files files each (varied sizes,
// modes, mtimes, xattrs), hardlinks from each directory to a file of
// another one, and read-only directories whose files must still be made
// before the directory's mode is set.
func buildWide(t *testing.T, dir string, dirs, files int) {
	t.Helper()
	rng := rand.New(rand.NewSource(11))
	for d := range dirs {
		dd := filepath.Join(dir, fmt.Sprintf("d%03d", d), "sub")
		must(t, os.MkdirAll(dd, 0o755))
		for f := range files {
			p := filepath.Join(dd, fmt.Sprintf("f%04d", f))
			data := make([]byte, rng.Intn(3)*rng.Intn(20000))
			rng.Read(data)
			must(t, os.WriteFile(p, data, os.FileMode(0o600|rng.Intn(0o177))))
			if f%7 == 0 {
				must(t, unix.Lsetxattr(p, "user.n", []byte(fmt.Sprint(f)), 0))
			}
			mt := time.Unix(1_600_000_000+int64(rng.Intn(1_000_000)), int64(rng.Intn(1e9)))
			must(t, os.Chtimes(p, mt, mt))
		}
		if d > 0 {
			prev := filepath.Join(dir, fmt.Sprintf("d%03d", d-1), "sub", "f0001")
			must(t, os.Link(prev, filepath.Join(dd, "link-to-prev")))
		}
	}
	for d := 0; d < dirs; d += 5 {
		must(t, os.Chmod(filepath.Join(dir, fmt.Sprintf("d%03d", d), "sub"), 0o555))
	}
}

// A Materialise with Workers makes the tree the sequential one makes: the
// scan of the result has the original's tree ID (every name, size, mode,
// owner, mtime, xattr, hardlink and directory mtime), for a small rich
// tree and a wide one with hardlinks across directories.
func TestMaterialiseWithWorkersIsTheSequentialResult(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	for _, build := range []struct {
		name string
		f    func(*testing.T, string)
	}{
		{"rich", buildRich},
		{"wide", func(t *testing.T, d string) { buildWide(t, d, 30, 40) }},
	} {
		t.Run(build.name, func(t *testing.T) {
			src := t.TempDir()
			build.f(t, src)
			mem := newMem()
			r1, err := Scan(ctx, src, ScanOptions{Saver: mem, Translate: overlayish})
			must(t, err)
			for _, workers := range []int{0, 2, 4, 8} {
				dst := t.TempDir()
				st, err := Materialise(ctx, r1.Root, dst, ApplyOptions{Loader: mem, Workers: workers})
				must(t, err)
				r2, err := Scan(ctx, dst, ScanOptions{Translate: overlayish})
				must(t, err)
				if r2.Root != r1.Root {
					t.Fatalf("workers %d: tree after materialise %s != original %s", workers, r2.Root.Short(), r1.Root.Short())
				}
				if st.Files == 0 || uint64(st.Entries) != uint64(r1.Stats.Entries) {
					t.Fatalf("workers %d: stats %+v, scan counted %d entries", workers, st, r1.Stats.Entries)
				}
			}
		})
	}
}

// A file the pool cannot write (its chunk is missing from the store)
// fails the whole Materialise with an error naming the path and the
// chunk, whichever worker met it, and the walk stops.
func TestMaterialiseWithWorkersFailsOnAMissingChunk(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	src := t.TempDir()
	buildWide(t, src, 10, 20)
	must(t, os.WriteFile(filepath.Join(src, "d004", "sub", "victim"), []byte("the one file whose chunk goes missing"), 0o644))
	mem := newMem()
	r1, err := Scan(ctx, src, ScanOptions{Saver: mem, Translate: overlayish})
	must(t, err)
	delete(mem.m, delta.Hash([]byte("the one file whose chunk goes missing")))
	for _, workers := range []int{0, 4} {
		_, err = Materialise(ctx, r1.Root, t.TempDir(), ApplyOptions{Loader: mem, Workers: workers})
		if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "d004/sub/victim") {
			t.Fatalf("workers %d: %v; want not found, naming d004/sub/victim", workers, err)
		}
	}
}
