package btrfs

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/btrfstest"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"golang.org/x/sys/unix"
)

// TestRandomEditsMatchFullWalk drives btrfs roots through many random edit
// sequences (creates, in-place writes, replacements, deletes, renames of
// files and directories, hardlinks, symlinks, modes, owners, mtimes,
// xattrs, temp files, directories replaced by files and back), with some
// scans left uncommitted and rollbacks (from restore points and from the
// store) in between. After every scan, the generation-based incremental
// result must equal a from-scratch full walk of the same state: the same
// tree ID and the same state key. After every rollback, the merged root
// must hash as it did when that checkpoint was taken.
func TestRandomEditsMatchFullWalk(t *testing.T) {
	pool := btrfstest.Pool(t)
	b, err := NewBackend(pool, Options{Keep: 3})
	if err != nil {
		t.Fatal(err)
	}
	seeds, steps := 24, 25
	if testing.Short() {
		seeds, steps = 4, 10
	}
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { runSequence(t, b, int64(seed), steps) })
	}
}

type taken struct {
	tree, key, merged delta.ID
}

func runSequence(t *testing.T, b *Backend, seed int64, steps int) {
	ctx := context.Background()
	rng := rand.New(rand.NewSource(seed))
	store := roottest.NewMemStore()
	base := randomBase(t, rng)
	res, err := delta.Scan(ctx, base, delta.ScanOptions{Saver: store})
	must(t, err)
	lower, err := b.PrepareBase(ctx, res.Root, store)
	must(t, err)
	dir := filepath.Join(t.TempDir(), "sb")
	r, err := b.Create(ctx, dir, lower, delta.EmptyTree(), store)
	must(t, err)
	t.Cleanup(func() { r.Remove(context.Background()) })
	var history []taken
	for step := range steps {
		for range 1 + rng.Intn(6) {
			randomEdit(t, rng, r.Path())
		}
		res, err := r.Scan(ctx, store)
		must(t, err)
		live, baseRoot, baseGen := r.internals(t)
		must(t, syncFS(live))
		// The oracle reads through the noatime mount: listing the live
		// subvolume through the pool's own mount would update directory
		// atimes, which is a change of their inodes.
		want, wantKey, trees := oracle(t, r.Path(), baseRoot, baseGen)
		if res.Root != want || res.StateKey != wantKey {
			var diff []string
			diffTrees(t, store, res.Root, memLoader{trees, store}, want, "", &diff)
			fd, _ := openDir(live)
			changedInodes(fd, baseGen, func(ino uint64, it inodeItem) error {
				ps, _ := inoPaths(fd, ino)
				t.Logf("touched since base (gen %d): ino %d %+v %q", baseGen, ino, it, ps)
				return nil
			})
			unix.Close(fd)
			t.Fatalf("step %d: incremental scan gives tree %s key %s, full walk %s %s; differences (incremental vs full):\n%s",
				step, res.Root.Short(), res.StateKey.Short(), want.Short(), wantKey.Short(), strings.Join(diff, "\n"))
		}
		if rng.Intn(5) > 0 {
			must(t, r.Committed(res))
			history = append(history, taken{res.Root, res.StateKey, roottest.Merged(t, r.Path())})
		}
		if len(history) > 0 && rng.Intn(6) == 0 {
			h := history[rng.Intn(len(history))]
			if rng.Intn(2) == 0 {
				must(t, r.PruneRestorePoints(ctx, 0)) // restore from the store
			}
			must(t, r.Restore(ctx, h.tree, store))
			if got := roottest.Merged(t, r.Path()); got != h.merged {
				t.Fatalf("step %d: rollback to %s gives a root hashing to %s, want %s", step, h.tree.Short(), got.Short(), h.merged.Short())
			}
			res, err := r.Scan(ctx, store)
			must(t, err)
			if res.StateKey != h.key {
				t.Fatalf("step %d: scan after rollback gives key %s, want %s", step, res.StateKey.Short(), h.key.Short())
			}
		}
	}
}

// internals returns the live subvolume, the base root and its generation.
func (r *Root) internals(t testing.TB) (string, string, uint64) {
	t.Helper()
	sbDir, g, err := r.gen()
	must(t, err)
	base, bi, err := r.baseDir(sbDir)
	must(t, err)
	return filepath.Join(g, "live"), filepath.Join(base, "root"), bi.Gen
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

var names = []string{"a", "b", "c", "d", "n1", "n2", "x", "y"}

func randomBase(t testing.TB, rng *rand.Rand) string {
	t.Helper()
	dir := t.TempDir()
	for i := range 40 {
		d := filepath.Join(dir, names[rng.Intn(4)], names[rng.Intn(len(names))])
		if rng.Intn(3) == 0 {
			d = filepath.Join(d, names[rng.Intn(len(names))])
		}
		must(t, os.MkdirAll(d, 0o755))
		p := filepath.Join(d, fmt.Sprintf("f%d", i))
		must(t, os.WriteFile(p, randomBytes(rng), 0o644))
		if i%7 == 0 {
			must(t, unix.Setxattr(p, "user.base", []byte{byte(i)}, 0))
		}
		if i%9 == 0 {
			ld := filepath.Join(dir, names[rng.Intn(4)])
			must(t, os.MkdirAll(ld, 0o755))
			must(t, os.Link(p, filepath.Join(ld, fmt.Sprintf("link%d", i))))
		}
	}
	must(t, os.Symlink("a", filepath.Join(dir, "sym")))
	must(t, unix.Mkfifo(filepath.Join(dir, "a", "fifo"), 0o644))
	return dir
}

func someBytes(rng *rand.Rand, max int) []byte {
	b := make([]byte, 1+rng.Intn(max))
	rng.Read(b)
	return b
}

func randomBytes(rng *rand.Rand) []byte {
	n := rng.Intn(3000)
	if rng.Intn(10) == 0 {
		n = 70 << 10 // several chunks
	}
	b := make([]byte, n)
	rng.Read(b)
	return b
}

// listing returns every path below root (files and directories), sorted.
func listing(t testing.TB, root string) (files, dirs []string) {
	t.Helper()
	dirs = []string{""}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case rel == ".":
		case d.IsDir():
			dirs = append(dirs, rel)
		default:
			files = append(files, rel)
		}
		return nil
	})
	must(t, err)
	return files, dirs
}

func pick(rng *rand.Rand, s []string) string { return s[rng.Intn(len(s))] }

// randomEdit makes one random change below root. Edits that the state
// forbids (renaming a directory into itself, ...) fail harmlessly.
func randomEdit(t testing.TB, rng *rand.Rand, root string) {
	t.Helper()
	files, dirs := listing(t, root)
	p := func(rel string) string { return filepath.Join(root, rel) }
	newName := func() string { return filepath.Join(pick(rng, dirs), pick(rng, names)) }
	regular := func() (string, bool) {
		for range 10 {
			if len(files) == 0 {
				return "", false
			}
			f := pick(rng, files)
			if fi, err := os.Lstat(p(f)); err == nil && fi.Mode().IsRegular() {
				return f, true
			}
		}
		return "", false
	}
	some := func() string {
		all := append(append([]string{}, files...), dirs[1:]...)
		if len(all) == 0 {
			return ""
		}
		return pick(rng, all)
	}
	switch op := rng.Intn(18); op {
	case 0: // create a file
		os.WriteFile(p(newName()), randomBytes(rng), 0o644)
	case 1: // write in place
		if f, ok := regular(); ok {
			fh, err := os.OpenFile(p(f), os.O_WRONLY, 0)
			if err == nil {
				fh.WriteAt(someBytes(rng, 100), int64(rng.Intn(200)))
				fh.Close()
			}
		}
	case 2: // replace through a rename
		if f, ok := regular(); ok {
			tmp := p(f) + ".tmp"
			os.WriteFile(tmp, randomBytes(rng), 0o640)
			os.Rename(tmp, p(f))
		}
	case 3: // delete a file
		if len(files) > 0 {
			os.Remove(p(pick(rng, files)))
		}
	case 4: // make a directory
		os.Mkdir(p(newName()), 0o755)
	case 5: // remove a directory tree
		if len(dirs) > 1 && rng.Intn(2) == 0 {
			os.RemoveAll(p(pick(rng, dirs[1:])))
		}
	case 6: // rename a file, maybe over another
		if len(files) > 0 {
			os.Rename(p(pick(rng, files)), p(newName()))
		}
	case 7: // rename a directory
		if len(dirs) > 1 {
			src, dst := pick(rng, dirs[1:]), newName()
			if !strings.HasPrefix(dst+"/", src+"/") {
				os.Rename(p(src), p(dst))
			}
		}
	case 8: // hardlink
		if f, ok := regular(); ok {
			os.Link(p(f), p(newName()))
		}
	case 9: // symlink
		os.Symlink(pick(rng, names), p(newName()))
	case 10: // mode
		if s := some(); s != "" {
			os.Lchown(p(s), 0, 0)
			if fi, err := os.Lstat(p(s)); err == nil && fi.Mode()&os.ModeSymlink == 0 {
				os.Chmod(p(s), []os.FileMode{0o755, 0o700, 0o644, 0o600}[rng.Intn(4)])
			}
		}
	case 11: // owner
		if s := some(); s != "" {
			os.Lchown(p(s), rng.Intn(3)*1000, rng.Intn(3)*1000)
		}
	case 12: // mtime
		if s := some(); s != "" {
			ts := time.Unix(int64(1600000000+rng.Intn(1000)), int64(rng.Intn(1e9)))
			unix.UtimesNanoAt(unix.AT_FDCWD, p(s), []unix.Timespec{unix.NsecToTimespec(ts.UnixNano()), unix.NsecToTimespec(ts.UnixNano())}, unix.AT_SYMLINK_NOFOLLOW)
		}
	case 13: // xattr set or removed
		if s := some(); s != "" {
			if rng.Intn(2) == 0 {
				unix.Lsetxattr(p(s), "user."+pick(rng, names), someBytes(rng, 20), 0)
			} else {
				unix.Lremovexattr(p(s), "user.base")
			}
		}
	case 14: // a temp file that comes and goes
		tmp := p(newName()) + ".swp"
		if os.WriteFile(tmp, []byte("tmp"), 0o600) == nil {
			os.Remove(tmp)
		}
	case 15: // a directory replaced by a file, or a file by a directory
		if s := some(); s != "" {
			os.RemoveAll(p(s))
			if rng.Intn(2) == 0 {
				os.WriteFile(p(s), randomBytes(rng), 0o644)
			} else {
				os.Mkdir(p(s), 0o755)
			}
		}
	case 16: // rewrite with the same bytes
		if f, ok := regular(); ok {
			if data, err := os.ReadFile(p(f)); err == nil {
				os.WriteFile(p(f), data, 0o644)
			}
		}
	case 17: // unlink one name of a multi-link file
		for _, f := range files {
			var st unix.Stat_t
			if unix.Lstat(p(f), &st) == nil && st.Nlink > 1 && st.Mode&unix.S_IFMT == unix.S_IFREG {
				os.Remove(p(f))
				break
			}
		}
	}
}

// diffTrees lists the entries where two trees differ.
func diffTrees(t testing.TB, la delta.BlobLoader, a delta.ID, lb delta.BlobLoader, b delta.ID, rel string, out *[]string) {
	ctx := context.Background()
	load := func(l delta.BlobLoader, id delta.ID) *delta.Tree {
		data, err := l.LoadBlob(ctx, delta.BlobTree, id)
		if err != nil {
			*out = append(*out, fmt.Sprintf("/%s: load %s: %v", rel, id.Short(), err))
			return &delta.Tree{}
		}
		tr, err := delta.DecodeTree(data)
		must(t, err)
		return tr
	}
	ta, tb := load(la, a), load(lb, b)
	seen := map[string]bool{}
	for _, e := range append(append([]delta.Entry{}, ta.Entries...), tb.Entries...) {
		if seen[e.Name] {
			continue
		}
		seen[e.Name] = true
		x, y := ta.Find(e.Name), tb.Find(e.Name)
		p := filepath.Join(rel, e.Name)
		switch {
		case x == nil || y == nil:
			*out = append(*out, fmt.Sprintf("/%s: %s vs %s", p, describe(x), describe(y)))
		case x.Type == delta.TypeDir && y.Type == delta.TypeDir:
			if x.Subtree != y.Subtree {
				diffTrees(t, la, x.Subtree, lb, y.Subtree, p, out)
			}
			xs, ys := *x, *y
			xs.Subtree, ys.Subtree = delta.ID{}, delta.ID{}
			if describe(&xs) != describe(&ys) {
				*out = append(*out, fmt.Sprintf("/%s: %s vs %s", p, describe(&xs), describe(&ys)))
			}
		case describe(x) != describe(y):
			*out = append(*out, fmt.Sprintf("/%s: %s vs %s", p, describe(x), describe(y)))
		}
	}
}

func describe(e *delta.Entry) string {
	if e == nil {
		return "absent"
	}
	return fmt.Sprintf("%s mode=%o uid=%d gid=%d mtime=%d size=%d opaque=%v target=%q xattrs=%d chunks=%d",
		e.Type, e.Mode, e.UID, e.GID, e.MtimeNs, e.Size, e.Opaque, e.Target, len(e.Xattrs), len(e.Chunks))
}
