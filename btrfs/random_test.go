package btrfs

import (
	"context"
	"fmt"
	"math/rand"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
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
	b, err := NewBackend(Options{Pool: pool, Keep: 3})
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
	res, err := fstree.Scan(ctx, base, fstree.ScanOptions{Saver: store})
	must(t, err)
	lower, err := b.PrepareBase(ctx, res.Root, store)
	must(t, err)
	dir := filepath.Join(t.TempDir(), "sb")
	r, err := b.CreateRoot(ctx, dir, lower, delta.EmptyTree(), store)
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
