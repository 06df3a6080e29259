package btrfs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/btrfstest"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"golang.org/x/sys/unix"
)

// These tests need root and a loop-mounted btrfs (btrfstest).

type sandbox struct {
	t     *testing.T
	ctx   context.Context
	b     *Backend
	store *roottest.MemStore
	lower string
	r     *Root
}

func newSandbox(t *testing.T, opts Options) *sandbox {
	t.Helper()
	pool := btrfstest.Pool(t)
	opts.Pool = pool
	b, err := NewBackend(opts)
	must(t, err)
	s := &sandbox{t: t, ctx: context.Background(), b: b, store: roottest.NewMemStore()}
	res, err := fstree.Scan(s.ctx, roottest.RichBase(t), fstree.ScanOptions{Saver: s.store})
	must(t, err)
	s.lower, err = b.PrepareBase(s.ctx, res.Root, s.store)
	must(t, err)
	s.r = s.create("sb", delta.EmptyTree())
	return s
}

func (s *sandbox) create(name string, tree delta.ID) *Root {
	s.t.Helper()
	dir := filepath.Join(s.t.TempDir(), name)
	r, err := s.b.CreateRoot(s.ctx, dir, s.lower, tree, s.store)
	must(s.t, err)
	s.t.Cleanup(func() { r.Remove(context.Background()) })
	return r
}

func (s *sandbox) checkpoint() *fstree.ScanResult {
	s.t.Helper()
	res, err := s.r.Scan(s.ctx, s.store)
	must(s.t, err)
	must(s.t, s.r.Committed(res))
	return res
}

// noLoader fails every read: a restore that needs the store fails.
type noLoader struct{}

func (noLoader) LoadBlob(_ context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	return nil, fmt.Errorf("%s %s: the store is not reachable: %w", t, id.Short(), errdefs.ErrUnavailable)
}

// physical returns the on-disk address of a file's first extent.
func physical(t *testing.T, p string) uint64 {
	t.Helper()
	f, err := os.Open(p)
	must(t, err)
	defer f.Close()
	const fsIocFiemap, fiemapFlagSync = 0xc020660b, 1
	buf := make([]byte, 32+56)
	ne := binary.NativeEndian
	ne.PutUint64(buf[8:], ^uint64(0))
	ne.PutUint32(buf[16:], fiemapFlagSync)
	ne.PutUint32(buf[24:], 1)
	must(t, ioctl(int(f.Fd()), fsIocFiemap, unsafe.Pointer(&buf[0])))
	if ne.Uint32(buf[20:]) == 0 {
		t.Fatalf("%s has no extent", p)
	}
	return ne.Uint64(buf[32+8:])
}

// TestRollbackUsesRestorePoints rolls back and forth with a store that
// cannot be read: only restore points can serve, and the restored file
// shares its extent with the one first written: no data was copied.
func TestRollbackUsesRestorePoints(t *testing.T) {
	s := newSandbox(t, Options{})
	big := filepath.Join(s.r.Path(), "big.bin")
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	must(t, os.WriteFile(big, data, 0o644))
	c1 := s.checkpoint()
	h1 := roottest.Merged(t, s.r.Path())
	addr := physical(t, big)
	must(t, os.Remove(big))
	roottest.AgentTurn(t, s.r.Path())
	c2 := s.checkpoint()
	h2 := roottest.Merged(t, s.r.Path())
	for i := range 3 {
		must(t, s.r.Restore(s.ctx, c1.Root, noLoader{}))
		if got := roottest.Merged(t, s.r.Path()); got != h1 {
			t.Fatalf("round %d: rollback to c1 gives %s, want %s", i, got.Short(), h1.Short())
		}
		if got := physical(t, big); got != addr {
			t.Fatalf("round %d: restored file lives at %d, the original at %d: data was copied", i, got, addr)
		}
		must(t, s.r.Restore(s.ctx, c2.Root, noLoader{}))
		if got := roottest.Merged(t, s.r.Path()); got != h2 {
			t.Fatalf("round %d: rollback to c2 gives %s, want %s", i, got.Short(), h2.Short())
		}
	}
	// A branch in another sandbox snapshots this sandbox's point.
	br := s.create("branch", c1.Root)
	if got := roottest.Merged(t, br.Path()); got != h1 {
		t.Fatalf("branch gives %s, want %s", got.Short(), h1.Short())
	}
	if got := physical(t, filepath.Join(br.Path(), "big.bin")); got != addr {
		t.Fatal("branch copied the data")
	}
}

// TestStoreFallbackWhenPointGone: without a restore point, a rollback
// needs the store; a failed one leaves the root as it was; a successful one
// makes a new restore point.
func TestStoreFallbackWhenPointGone(t *testing.T) {
	s := newSandbox(t, Options{})
	roottest.AgentTurn(t, s.r.Path())
	c1 := s.checkpoint()
	h1 := roottest.Merged(t, s.r.Path())
	roottest.Write(t, filepath.Join(s.r.Path(), "later"), "x")
	s.checkpoint()
	h2 := roottest.Merged(t, s.r.Path())
	must(t, s.r.PruneRestorePoints(s.ctx, 0))
	if pts, _ := s.r.RestorePoints(); len(pts) != 0 {
		t.Fatalf("%d restore points after pruning to 0", len(pts))
	}
	err := s.r.Restore(s.ctx, c1.Root, noLoader{})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("rollback without point or store: %v", err)
	}
	if got := roottest.Merged(t, s.r.Path()); got != h2 {
		t.Fatal("failed rollback changed the root")
	}
	must(t, s.r.Restore(s.ctx, c1.Root, s.store))
	if got := roottest.Merged(t, s.r.Path()); got != h1 {
		t.Fatalf("rollback from the store gives %s, want %s", got.Short(), h1.Short())
	}
	if pts, _ := s.r.RestorePoints(); len(pts) != 1 || pts[0] != c1.Root {
		t.Fatalf("restore points after restoring from the store: %v", pts)
	}
	must(t, s.r.Restore(s.ctx, delta.EmptyTree(), noLoader{})) // the base itself
	must(t, s.r.Restore(s.ctx, c1.Root, noLoader{}))           // the new point
	if got := roottest.Merged(t, s.r.Path()); got != h1 {
		t.Fatal("rollback to the point made from the store differs")
	}
}

// TestLostScanStateIsRebuilt: with the records gone or damaged, the next
// scan rebuilds them from the base and still gives the right layer.
func TestLostScanStateIsRebuilt(t *testing.T) {
	s := newSandbox(t, Options{})
	roottest.AgentTurn(t, s.r.Path())
	c1 := s.checkpoint()
	_, g, err := s.r.gen()
	must(t, err)
	meta := filepath.Join(g, "meta")
	for _, damage := range []func(){
		func() { must(t, os.Remove(filepath.Join(meta, "head"))) },
		func() {
			recs, _ := filepath.Glob(filepath.Join(meta, "r", "*", "*"))
			for _, r := range recs {
				must(t, os.WriteFile(r, []byte("garbage"), 0o600))
			}
		},
	} {
		damage()
		roottest.Write(t, filepath.Join(s.r.Path(), "src/main.go"), "package main // again\n")
		res, err := s.r.Scan(s.ctx, s.store)
		must(t, err)
		live, baseRoot, baseGen := s.r.internals(t)
		must(t, syncFS(live))
		want, wantKey, _ := oracle(t, s.r.Path(), baseRoot, baseGen)
		if res.Root != want || res.StateKey != wantKey || res.Root == c1.Root {
			t.Fatalf("scan after losing the state: %s, full walk %s", res.Root.Short(), want.Short())
		}
		must(t, s.r.Committed(res))
	}
}

// TestChangedInodesCostFollowsChange counts what the tree search returns:
// after changing 3 files of a 20,000-file subvolume it reads only the few
// leaves those inodes live in, not the tree.
func TestChangedInodesCostFollowsChange(t *testing.T) {
	pool := btrfstest.Pool(t)
	sv := filepath.Join(pool, "sv")
	must(t, createSubvolume(sv))
	for d := range 100 {
		must(t, os.Mkdir(filepath.Join(sv, fmt.Sprint("d", d)), 0o755))
		for f := range 200 {
			must(t, os.WriteFile(filepath.Join(sv, fmt.Sprint("d", d), fmt.Sprint("f", f)), []byte("x"), 0o644))
		}
	}
	must(t, syncFS(sv))
	must(t, snapshot(sv, filepath.Join(pool, "snap"), true))
	si, err := getSubvolInfo(filepath.Join(pool, "snap"))
	must(t, err)
	for _, p := range []string{"d3/f7", "d50/f100", "d99/f199"} {
		must(t, os.WriteFile(filepath.Join(sv, p), []byte("changed"), 0o644))
	}
	must(t, syncFS(sv))
	fd, err := openDir(sv)
	must(t, err)
	defer unix.Close(fd)
	items := 0
	k := searchKey{minObjectID: firstFreeObjectID, maxObjectID: lastFreeObjectID, maxType: 255, maxOffset: ^uint64(0), minTransid: si.Otransid + 1}
	must(t, treeSearch(fd, k, searchBufSize, func(uint64, uint32, uint64, []byte) error { items++; return nil }))
	changed := 0
	must(t, changedInodes(fd, si.Otransid, func(uint64, inodeItem) error { changed++; return nil }))
	all := 0
	must(t, changedInodes(fd, 0, func(uint64, inodeItem) error { all++; return nil }))
	t.Logf("tree of %d inodes: %d items in rewritten leaves, %d changed inodes", all, items, changed)
	if changed != 3 {
		t.Fatalf("%d changed inodes, want 3", changed)
	}
	if items > all/10 {
		t.Fatalf("the search read %d items of a %d-inode tree", items, all)
	}
}
