package frozen_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/overlay"
	"github.com/turnsnap/turnsnap/overlay/frozen"
	"golang.org/x/sys/unix"
)

// TestFreezeVerifiesTheLiveCopy: files whose live bytes no longer match
// the tree come from the store; unchanged ones are hardlinks of the source
// layer; leftovers of a killed freeze are swept, and a device node is not
// frozen at all.
func TestFreezeVerifiesTheLiveCopy(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	store := roottest.NewMemStore()
	live := t.TempDir()
	roottest.Write(t, filepath.Join(live, "a/same"), "same\n")
	roottest.Write(t, filepath.Join(live, "a/changes"), "as checkpointed\n")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink("same", filepath.Join(live, "a/link")))
	must(unix.Mknod(filepath.Join(live, "gone"), unix.S_IFCHR, 0)) // a whiteout
	res1, err := fstree.Scan(ctx, live, fstree.ScanOptions{Saver: store, Translate: overlay.Translate})
	must(err)
	b := frozen.NewLayers(t.TempDir(), overlay.Translate)
	top := b.Top()
	must(os.MkdirAll(filepath.Join(top, ".tmp-killed/x"), 0o700))
	st, err := b.Freeze(ctx, res1.Root, live, nil, store, nil)
	must(err)
	if st.Copied != 2 || st.FromStore != 0 || st.Linked != 0 {
		t.Fatalf("first freeze: %+v", st)
	}
	if _, err := os.Stat(filepath.Join(top, ".tmp-killed")); !os.IsNotExist(err) {
		t.Fatal("a killed freeze's build was not swept")
	}
	roottest.Write(t, filepath.Join(live, "a/changes"), "changed again\n")
	res2, err := fstree.Scan(ctx, live, fstree.ScanOptions{Saver: store, Translate: overlay.Translate})
	must(err)
	// The sandbox moves on before the layer is made: the copy must not
	// take its bytes.
	roottest.Write(t, filepath.Join(live, "a/changes"), "changed after the cut\n")
	st, err = b.Freeze(ctx, res2.Root, live, &frozen.Source{Tree: res1.Root}, store, nil)
	must(err)
	if st.Linked != 1 || st.FromStore != 1 || st.Copied != 0 {
		t.Fatalf("second freeze: %+v", st)
	}
	dir := b.Dir(res2.Root)
	if data, _ := os.ReadFile(filepath.Join(dir, "a/changes")); string(data) != "changed again\n" {
		t.Fatalf("frozen copy holds %q, the checkpoint has %q", data, "changed again\n")
	}
	var s1, s2 unix.Stat_t
	must(unix.Stat(filepath.Join(b.Dir(res1.Root), "a/same"), &s1))
	must(unix.Stat(filepath.Join(dir, "a/same"), &s2))
	// Cloned from the source layer, never hardlinked to it: a lower
	// layer's link count shows inside every sandbox stacked on it.
	if s1.Ino == s2.Ino || s1.Nlink != 1 || s2.Nlink != 1 {
		t.Fatalf("an unchanged file shares an inode with the source layer (links %d and %d)", s1.Nlink, s2.Nlink)
	}
	got, err := fstree.Scan(ctx, dir, fstree.ScanOptions{Translate: overlay.Translate})
	must(err)
	if got.Root != res2.Root {
		t.Fatalf("frozen layer hashes to %s, its tree is %s", got.Root.Short(), res2.Root.Short())
	}
	if ok, err := b.Remove(res1.Root, func(string) bool { return true }); ok || err != nil {
		t.Fatalf("a layer in use was removed: %v %v", ok, err)
	}
	if ok, err := b.Remove(res1.Root, func(string) bool { return false }); !ok || err != nil {
		t.Fatalf("remove: %v %v", ok, err)
	}
	b.WaitRemovals()
	if ids, _ := b.Trees(); len(ids) != 1 || ids[0] != res2.Root {
		t.Fatalf("frozen trees after removal: %v", ids)
	}

	must(unix.Mknod(filepath.Join(live, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	res3, err := fstree.Scan(ctx, live, fstree.ScanOptions{Saver: store, Translate: overlay.Translate})
	must(err)
	if _, err := b.Freeze(ctx, res3.Root, live, nil, store, nil); !errors.Is(err, frozen.ErrNotFreezable) {
		t.Fatalf("a device node was frozen: %v", err)
	}
	if b.Has(res3.Root) {
		t.Fatal("a failed freeze published a layer")
	}
}

// TestFreezeReusesUnkeptLayer: an incremental freeze changes an unkept
// layer into the new tree name by name (files replaced, never written in
// place: the layers sharing them keep their bytes), and refuses a layer a
// root stacks on or a tree with hardlinks.
func TestFreezeReusesUnkeptLayer(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	store := roottest.NewMemStore()
	live := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	p := func(rel string) string { return filepath.Join(live, rel) }
	scan := func() delta.ID { return scanUpper(t, live, store) }
	for i := range 20 {
		roottest.Write(t, p(filepath.Join("keep", "d", string(rune('a'+i)))), "unchanged\n")
	}
	roottest.Write(t, p("a/file"), "one\n")
	roottest.Write(t, p("a/mode"), "mode\n")
	roottest.Write(t, p("a/xattr"), "xattr\n")
	roottest.Write(t, p("todir/x"), "dir\n")
	roottest.Write(t, p("gone/deep/x"), "gone\n")
	must(os.Symlink("one", p("a/link")))
	must(unix.Setxattr(p("a"), "user.dir", []byte("d"), 0))
	must(unix.Mknod(p("wh1"), unix.S_IFCHR, 0))
	must(os.Mkdir(p("op"), 0o755))
	must(unix.Setxattr(p("op"), fstree.OpaqueXattr, []byte("y"), 0))
	t1 := scan()
	b := frozen.NewLayers(t.TempDir(), overlay.Translate)
	_, err := b.Freeze(ctx, t1, live, nil, store, nil)
	must(err)

	roottest.Write(t, p("a/file"), "two\n")
	must(os.Chmod(p("a/mode"), 0o600))
	t2 := scan()
	_, err = b.Freeze(ctx, t2, live, &frozen.Source{Tree: t1}, store, nil)
	must(err)

	roottest.Write(t, p("a/file"), "three\n")
	must(unix.Setxattr(p("a/xattr"), "user.k", []byte("v"), 0))
	must(unix.Removexattr(p("a"), "user.dir"))
	must(os.RemoveAll(p("todir")))
	must(os.Symlink("elsewhere", p("todir")))
	must(os.Remove(p("a/link")))
	must(os.Symlink("two", p("a/link")))
	must(os.RemoveAll(p("gone")))
	roottest.Write(t, p("new/deep/y"), "new\n")
	must(os.Remove(p("wh1")))
	must(unix.Mknod(p("wh2"), unix.S_IFCHR, 0))
	must(unix.Removexattr(p("op"), fstree.OpaqueXattr))
	must(os.Mkdir(p("op2"), 0o755))
	must(unix.Setxattr(p("op2"), fstree.OpaqueXattr, []byte("y"), 0))
	t3 := scan()
	// The cut is taken; the sandbox moves on before the freeze reads.
	roottest.Write(t, p("new/deep/y"), "after the cut\n")

	inUse := func(string) bool { return true }
	st, err := b.Freeze(ctx, t3, live, &frozen.Source{Tree: t2, Reuse: []delta.ID{t1}, InUse: inUse}, store, nil)
	must(err)
	if !st.Reused.IsZero() || !b.Has(t1) {
		t.Fatalf("a layer a root stacks on was reused: %+v", st)
	}
	_, err = b.Remove(t3, func(string) bool { return false })
	must(err)
	b.WaitRemovals()

	st, err = b.Freeze(ctx, t3, live, &frozen.Source{Tree: t2, Reuse: []delta.ID{t1}, InUse: func(string) bool { return false }}, store, nil)
	must(err)
	if st.Reused != t1 || b.Has(t1) || st.Patched == 0 || st.Removed == 0 || st.FromStore != 1 {
		t.Fatalf("incremental freeze: %+v (layer of t1 still kept: %v)", st, b.Has(t1))
	}
	if st.Entries > 12 {
		t.Fatalf("incremental freeze wrote %d entries: it did not skip unchanged subtrees", st.Entries)
	}
	for _, c := range []struct{ tree delta.ID }{{t2}, {t3}} {
		got, err := fstree.Scan(ctx, b.Dir(c.tree), fstree.ScanOptions{Translate: overlay.Translate})
		must(err)
		if got.Root != c.tree {
			t.Fatalf("layer of %s hashes to %s", c.tree.Short(), got.Root.Short())
		}
	}
	if data, _ := os.ReadFile(filepath.Join(b.Dir(t2), "a/file")); string(data) != "two\n" {
		t.Fatalf("the layer sharing files with the reused one changed: %q", data)
	}

	// A hardlink group may reach into unchanged subtrees: built in full.
	must(os.Link(p("a/file"), p("keep/hard")))
	t4 := scan()
	st, err = b.Freeze(ctx, t4, live, &frozen.Source{Tree: t3, Reuse: []delta.ID{t2}, InUse: func(string) bool { return false }}, store, nil)
	must(err)
	if !st.Reused.IsZero() || !b.Has(t2) {
		t.Fatalf("a tree with hardlinks was frozen incrementally: %+v", st)
	}
	got, err := fstree.Scan(ctx, b.Dir(t4), fstree.ScanOptions{Translate: overlay.Translate})
	must(err)
	if got.Root != t4 {
		t.Fatal("the layer of a tree with hardlinks does not hash to it")
	}
}

// refusing is a store that has lost one blob.
type refusing struct {
	delta.BlobLoader
	lost delta.ID
}

func (r refusing) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	if id == r.lost {
		return nil, errdefs.ErrNotFound
	}
	return r.BlobLoader.LoadBlob(ctx, t, id)
}

// TestFreezeReuseFallsBack: a reused layer whose tree can no longer be
// read is given up and the new layer built in full, still exact.
func TestFreezeReuseFallsBack(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	store := roottest.NewMemStore()
	live := t.TempDir()
	scan := func() delta.ID { return scanUpper(t, live, store) }
	roottest.Write(t, filepath.Join(live, "a/x"), "one\n")
	t1 := scan()
	roottest.Write(t, filepath.Join(live, "a/x"), "two\n")
	t2 := scan()
	b := frozen.NewLayers(t.TempDir(), overlay.Translate)
	for _, tr := range []delta.ID{t1, t2} {
		if _, err := b.Freeze(ctx, tr, live, nil, store, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := b.HasLinks(ctx, store, tr); err != nil {
			t.Fatal(err)
		}
	}
	roottest.Write(t, filepath.Join(live, "b"), "three\n")
	t3 := scan()
	st, err := b.Freeze(ctx, t3, live, &frozen.Source{Tree: t2, Reuse: []delta.ID{t1}, InUse: func(string) bool { return false }}, refusing{store, t1}, nil)
	if err != nil || !st.Reused.IsZero() || st.Linked != 1 || b.Has(t1) {
		t.Fatalf("freeze with an unreadable reused tree: %+v %v (old layer kept: %v, so not taken)", st, err, b.Has(t1))
	}
	got, err := fstree.Scan(ctx, b.Dir(t3), fstree.ScanOptions{Translate: overlay.Translate})
	if err != nil || got.Root != t3 {
		t.Fatalf("fallback layer hashes to %v (%v), want %s", got, err, t3.Short())
	}
	if left, _ := filepath.Glob(filepath.Join(b.Top(), ".tmp-*")); len(left) != 0 {
		t.Fatalf("left %v", left)
	}
}

// TestFrozenLayerBeingReadStays: while a layer is read (a verify's scan, a
// freeze's source) no freeze takes it to patch and no removal takes it
// away; once the reader is done both may.
func TestFrozenLayerBeingReadStays(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	store := roottest.NewMemStore()
	live := t.TempDir()
	scan := func() delta.ID { return scanUpper(t, live, store) }
	b := frozen.NewLayers(t.TempDir(), overlay.Translate)
	var trees []delta.ID
	for i := range 3 {
		roottest.Write(t, filepath.Join(live, "f"), strings.Repeat("x", i+1))
		trees = append(trees, scan())
		src := &frozen.Source{}
		if i > 0 {
			src.Tree = trees[i-1]
		}
		if i == 2 {
			// t0 is read meanwhile: the freeze must build afresh.
			fd, done, err := b.ReadLayer(trees[0])
			if err != nil || done == nil {
				t.Fatalf("readLayer: %v", err)
			}
			src.Reuse, src.InUse = []delta.ID{trees[0]}, func(string) bool { return false }
			st, err := b.Freeze(ctx, trees[2], live, src, store, nil)
			if err != nil || !st.Reused.IsZero() {
				t.Fatalf("a layer being read was reused: %+v, %v", st, err)
			}
			if gone, err := b.Remove(trees[0], func(string) bool { return false }); gone || err != nil || !b.Has(trees[0]) {
				t.Fatalf("a layer being read was removed: %v, %v", gone, err)
			}
			unix.Close(fd)
			done()
			if gone, err := b.Remove(trees[0], func(string) bool { return false }); !gone || err != nil {
				t.Fatalf("the layer once read: removed %v, %v", gone, err)
			}
			b.WaitRemovals()
			break
		}
		if _, err := b.Freeze(ctx, trees[i], live, src, store, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, tr := range trees[1:] {
		if ok, err := b.Verify(ctx, tr); !ok || err != nil {
			t.Fatalf("layer %s: %v, %v", tr.Short(), ok, err)
		}
	}
}

// scanUpper scans live as a writable layer, storing its blobs in store, and
// returns its tree.
func scanUpper(t *testing.T, live string, store *roottest.MemStore) delta.ID {
	t.Helper()
	res, err := fstree.Scan(context.Background(), live, fstree.ScanOptions{Saver: store, Translate: overlay.Translate})
	if err != nil {
		t.Fatal(err)
	}
	return res.Root
}
