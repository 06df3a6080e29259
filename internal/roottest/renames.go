package roottest

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"golang.org/x/sys/unix"
)

// checkLayer asserts that a root built from the layer res alone shows
// exactly what the live root shows (want) and scans to the same state key.
func (f *fixture) checkLayer(name string, live rootfs.Root, res *fstree.ScanResult, want delta.ID) {
	f.t.Helper()
	c, _ := f.create(name, res.Root)
	if got := Merged(f.t, c.Path()); got != want {
		f.t.Fatalf("%s: a root made from the layer hashes to %s, the live root to %s; differences (copy, live):\n%s",
			name, got.Short(), want.Short(), describeDiff(c.Path(), live.Path()))
	}
	cres, err := c.Scan(f.ctx, nil)
	must(f.t, err)
	if cres.StateKey != res.StateKey {
		f.t.Fatalf("%s: the copy scans to state key %s, the live root %s", name, cres.StateKey.Short(), res.StateKey.Short())
	}
	must(f.t, c.Remove(f.ctx))
}

// testDirRenames renames base directories with rename(2) itself (as
// os.Rename, Python's os.rename and git mv do): each must work, and the
// layer must describe the merged state, through a restore in place, a
// restore into a new root and a remount.
func testDirRenames(t *testing.T, s Setup) {
	f := newFixture(t, s)
	r, dir := f.create("sb", f.s.IDs.EmptyTree())
	p := func(rel string) string { return filepath.Join(r.Path(), rel) }
	must(t, os.Rename(p("src"), p("source")))                // a base dir with subdirs
	Write(t, p("source/lib/new.go"), "package lib // new\n") // a change below it
	must(t, os.Remove(p("source/lib/b.go")))                 // a deletion below it
	must(t, os.Rename(p("deep/a/b"), p("etc/b")))            // into another base dir
	must(t, os.Rename(p("etc/b/c"), p("etc/c2")))            // out of a renamed dir
	must(t, os.Mkdir(p("deep/a/b"), 0o755))                  // a new dir at the old name
	must(t, os.Rename(p("links"), p("l1")))                  // renamed twice
	must(t, os.Rename(p("l1"), p("l2")))                     //
	must(t, os.Rename(p("doomed"), p("tmp/doomed")))         // into a sticky dir
	must(t, os.Rename(p("tmp/doomed"), p("doomed")))         // and back
	want := Merged(t, r.Path())
	if _, err := os.Stat(p("source/lib/a.go")); err != nil {
		t.Fatalf("renamed directory lost its base contents: %v", err)
	}
	res := f.checkpoint(r)
	if e := f.entryAt(res.Root, "src"); e == nil || e.Type != delta.TypeWhiteout {
		t.Fatalf("old name of a renamed dir: %+v, want a whiteout", e)
	}
	if e := f.entryAt(res.Root, "source/lib/a.go"); e == nil || e.Type != delta.TypeFile {
		t.Fatalf("renamed dir's base file in the layer: %+v, want the file (a renamed dir is recorded whole)", e)
	}
	f.checkLayer("copy", r, res, want)
	// A remount (a reboot) shows the same state and scans the same.
	must(t, r.Unmount(f.ctx))
	r = s.Backend.Open(dir, f.lower)
	must(t, r.Mount(f.ctx))
	if got := Merged(t, r.Path()); got != want {
		t.Fatalf("after a remount the root hashes to %s, want %s", got.Short(), want.Short())
	}
	again, err := r.Scan(f.ctx, nil)
	must(t, err)
	if again.StateKey != res.StateKey {
		t.Fatalf("after a remount the scan gives key %s, want %s", again.StateKey.Short(), res.StateKey.Short())
	}
	// Rename more, then roll back in place to the checkpoint.
	must(t, os.Rename(p("source"), p("src3")))
	must(t, r.Restore(f.ctx, res.Root, f.store))
	if got := Merged(t, r.Path()); got != want {
		t.Fatalf("restore in place hashes to %s, want %s", got.Short(), want.Short())
	}
	// Renames work on a restored root too, and its layer restores.
	must(t, os.Rename(p("source/lib"), p("lib2")))
	must(t, os.Rename(p("etc"), p("etc2")))
	want2 := Merged(t, r.Path())
	f.checkLayer("copy2", r, f.checkpoint(r), want2)
}

// testLongPaths checks a path of about 4,090 bytes inside the sandbox
// (legal there; far too long once a host prefix is added) checkpoints and
// restores, in a new directory and below a base directory.
func testLongPaths(t *testing.T, s Setup) {
	f := newFixture(t, s)
	r, _ := f.create("sb", f.s.IDs.EmptyTree())
	var parts []string
	for i := range 16 {
		parts = append(parts, strings.Repeat(string(rune('a'+i)), 250))
	}
	for _, top := range []string{"", "src"} {
		rel := mkChain(t, filepath.Join(r.Path(), top), parts, strings.Repeat("f", 60), "deep content")
		if n := len(filepath.Join(top, rel)); n < 4050 || n >= 4096 {
			t.Fatalf("test path is %d bytes", n)
		}
	}
	want := Merged(t, r.Path())
	res := f.checkpoint(r)
	f.checkLayer("copy", r, res, want)
	must(t, r.Restore(f.ctx, f.s.IDs.EmptyTree(), f.store))
	must(t, r.Restore(f.ctx, res.Root, f.store))
	if got := Merged(t, r.Path()); got != want {
		t.Fatalf("restore in place hashes to %s, want %s", got.Short(), want.Short())
	}
}

// mkChain creates directories parts below root one component at a time
// (no single path argument may be that long) and a file leaf at the
// bottom. It returns the file's path relative to root.
func mkChain(t testing.TB, root string, parts []string, leaf, content string) string {
	t.Helper()
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	for _, p := range parts {
		if err := unix.Mkdirat(fd, p, 0o755); err != nil && err != unix.EEXIST {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		must(t, err)
		unix.Close(fd)
		fd = next
	}
	defer unix.Close(fd)
	ffd, err := unix.Openat(fd, leaf, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644)
	must(t, err)
	_, err = unix.Write(ffd, []byte(content))
	must(t, err)
	unix.Close(ffd)
	return strings.Join(append(parts, leaf), "/")
}

// testRandomEdits drives a root through random edits, directory renames
// (rename(2)) among them, and after every checkpoint checks the layer
// against a plain walk of the live root: a root made from the layer alone
// must hash the same. Now and then it remounts or rolls back in place.
func testRandomEdits(t *testing.T, s Setup) {
	seeds, steps := 6, 8
	if testing.Short() {
		seeds, steps = 2, 5
	}
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			f := newFixture(t, s)
			rng := rand.New(rand.NewSource(int64(seed)))
			r, dir := f.create("sb", f.s.IDs.EmptyTree())
			type point struct {
				res    *fstree.ScanResult
				merged delta.ID
			}
			var history []point
			for step := range steps {
				for range 1 + rng.Intn(5) {
					randomEdit(t, rng, r.Path())
				}
				want := Merged(t, r.Path())
				res := f.checkpoint(r)
				f.checkLayer(fmt.Sprint("step", step), r, res, want)
				history = append(history, point{res, want})
				switch rng.Intn(4) {
				case 0:
					must(t, r.Unmount(f.ctx))
					r = s.Backend.Open(dir, f.lower)
					must(t, r.Mount(f.ctx))
					if got := Merged(t, r.Path()); got != want {
						t.Fatalf("step %d: remount changed the root: %s, want %s", step, got.Short(), want.Short())
					}
				case 1:
					h := history[rng.Intn(len(history))]
					must(t, r.Restore(f.ctx, h.res.Root, f.store))
					if got := Merged(t, r.Path()); got != h.merged {
						t.Fatalf("step %d: rollback hashes to %s, want %s", step, got.Short(), h.merged.Short())
					}
				}
			}
		})
	}
}

// randomEdit makes one random change below root.
func randomEdit(t *testing.T, rng *rand.Rand, root string) {
	t.Helper()
	dirs, files := Tree(root)
	pick := func(l []string) string { return Pick(rng, l) }
	p := func(rel string) string { return filepath.Join(root, rel) }
	name := fmt.Sprintf("n%d", rng.Intn(1000))
	into := pick(append(slices.Clone(dirs), ""))
	switch rng.Intn(9) {
	case 0, 1: // rename a directory somewhere else (not below itself)
		d := pick(dirs)
		if d == "" || into == d || strings.HasPrefix(into, d+"/") {
			return
		}
		if err := os.Rename(p(d), p(filepath.Join(into, name))); err != nil {
			t.Fatalf("rename(2) of directory %s: %v", d, err)
		}
	case 2: // rename a file
		if fl := pick(files); fl != "" {
			must(t, os.Rename(p(fl), p(filepath.Join(into, name))))
		}
	case 3:
		Write(t, p(filepath.Join(into, name)), strings.Repeat("x", rng.Intn(5000)))
	case 4: // append to a file (a copy-up of a base file)
		if fl := pick(files); fl != "" {
			fh, err := os.OpenFile(p(fl), os.O_WRONLY|os.O_APPEND, 0)
			must(t, err)
			fh.WriteString("appended\n")
			fh.Close()
		}
	case 5:
		if fl := pick(files); fl != "" {
			must(t, os.Remove(p(fl)))
		}
	case 6:
		if d := pick(dirs); d != "" {
			must(t, os.RemoveAll(p(d)))
		}
	case 7:
		must(t, os.MkdirAll(p(filepath.Join(into, name, "sub")), 0o755))
	case 8:
		if d := pick(dirs); d != "" {
			must(t, os.Chmod(p(d), 0o700|os.FileMode(rng.Intn(0o100))))
		}
	}
}

// describeDiff lists, for a failure message, the paths whose type, mode,
// owner, size, mtime or content differ between two roots.
func describeDiff(a, b string) string {
	type info struct {
		st   unix.Stat_t
		data string
	}
	read := func(root string) map[string]info {
		out := map[string]info{}
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			rel, _ := filepath.Rel(root, p)
			var in info
			unix.Lstat(p, &in.st)
			if d.Type().IsRegular() {
				data, _ := os.ReadFile(p)
				in.data = string(data)
			}
			out[rel] = in
			return nil
		})
		return out
	}
	ma, mb := read(a), read(b)
	var diffs []string
	for rel, x := range ma {
		y, ok := mb[rel]
		switch {
		case !ok:
			diffs = append(diffs, "only in the first: "+rel)
		case x.st.Mode != y.st.Mode || x.st.Uid != y.st.Uid || x.st.Size != y.st.Size || x.data != y.data ||
			(x.st.Mode&unix.S_IFMT != unix.S_IFDIR && x.st.Mtim != y.st.Mtim) || x.st.Nlink != y.st.Nlink:
			diffs = append(diffs, fmt.Sprintf("%s: mode %o/%o size %d/%d nlink %d/%d mtime %v/%v", rel, x.st.Mode, y.st.Mode, x.st.Size, y.st.Size, x.st.Nlink, y.st.Nlink, x.st.Mtim, y.st.Mtim))
		case x.st.Mtim != y.st.Mtim:
			diffs = append(diffs, fmt.Sprintf("%s: dir mtime %v/%v", rel, x.st.Mtim, y.st.Mtim))
		}
	}
	for rel := range mb {
		if _, ok := ma[rel]; !ok {
			diffs = append(diffs, "only in the second: "+rel)
		}
	}
	slices.Sort(diffs)
	return strings.Join(diffs, "\n")
}

// Tree lists the directories and regular files below root, as paths
// relative to it, in walk order: what a random edit picks from.
func Tree(root string) (dirs, files []string) {
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			dirs = append(dirs, rel)
		} else if d.Type().IsRegular() {
			files = append(files, rel)
		}
		return nil
	})
	return dirs, files
}

// Pick is a random element of l, or "" when l is empty.
func Pick(rng *rand.Rand, l []string) string {
	if len(l) == 0 {
		return ""
	}
	return l[rng.Intn(len(l))]
}
