package overlay

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"golang.org/x/sys/unix"
)

func TestStackOptions(t *testing.T) {
	got, err := StackOptions([]string{"/h/bases/.frozen/f", "/h/bases/b"}, "/h/s/gen-1/upper", "/h/s/gen-1/work")
	if err != nil || got != "lowerdir=/h/bases/.frozen/f:/h/bases/b,upperdir=/h/s/gen-1/upper,workdir=/h/s/gen-1/work,"+FeatureOptions {
		t.Fatalf("StackOptions = %q, %v", got, err)
	}
	if got, _ := StackOptions([]string{"/b"}, "/u", "/w"); got != "lowerdir=/b,upperdir=/u,workdir=/w,"+FeatureOptions {
		t.Fatalf("a plain stack: %q", got)
	}
	for _, bad := range [][]string{nil, {"/f:x", "/b"}, {"rel", "/b"}, {"/f", "/g", "/b"}} {
		if _, err := StackOptions(bad, "/u", "/w"); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("lowers %q accepted: %v", bad, err)
		}
	}
}

// FuzzReadStack: a stack file is local, but a damaged one must be refused
// (ErrCorrupt or ErrInvalid), never mounted with a path overlay would split.
func FuzzReadStack(f *testing.F) {
	f.Add([]byte(`{"frozen":"/h/bases/.frozen/x","tree":"` + delta.EmptyTree().String() + `","state_key":"` + delta.EmptyTree().String() + `"}`))
	f.Add([]byte(`{"frozen":"/a:b","tree":"00"}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		g := t.TempDir()
		if err := os.WriteFile(filepath.Join(g, stackFileName), data, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := readStack(g)
		if err != nil {
			if !errors.Is(err, errdefs.ErrCorrupt) && !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("error of no class: %v", err)
			}
			return
		}
		if s == nil || s.Tree.IsZero() || checkOptionPath(s.Frozen) != nil {
			t.Fatalf("accepted %+v", s)
		}
	})
}

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
	res1, err := delta.Scan(ctx, live, delta.ScanOptions{Saver: store, Translate: Translate})
	must(err)
	b := NewBackend(t.TempDir())
	top := filepath.Join(b.bases, frozenDirName)
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
	res2, err := delta.Scan(ctx, live, delta.ScanOptions{Saver: store, Translate: Translate})
	must(err)
	// The sandbox moves on before the layer is made: the copy must not
	// take its bytes.
	roottest.Write(t, filepath.Join(live, "a/changes"), "changed after the cut\n")
	st, err = b.Freeze(ctx, res2.Root, live, &FreezeSource{Tree: res1.Root}, store, nil)
	must(err)
	if st.Linked != 1 || st.FromStore != 1 || st.Copied != 0 {
		t.Fatalf("second freeze: %+v", st)
	}
	dir := b.FrozenDir(res2.Root)
	if data, _ := os.ReadFile(filepath.Join(dir, "a/changes")); string(data) != "changed again\n" {
		t.Fatalf("frozen copy holds %q, the checkpoint has %q", data, "changed again\n")
	}
	var s1, s2 unix.Stat_t
	must(unix.Stat(filepath.Join(b.FrozenDir(res1.Root), "a/same"), &s1))
	must(unix.Stat(filepath.Join(dir, "a/same"), &s2))
	if s1.Ino != s2.Ino {
		t.Fatal("an unchanged file was copied, not linked")
	}
	got, err := delta.Scan(ctx, dir, delta.ScanOptions{Translate: Translate})
	must(err)
	if got.Root != res2.Root {
		t.Fatalf("frozen layer hashes to %s, its tree is %s", got.Root.Short(), res2.Root.Short())
	}
	if ok, err := b.RemoveFrozen(res1.Root, func(string) bool { return true }); ok || err != nil {
		t.Fatalf("a layer in use was removed: %v %v", ok, err)
	}
	if ok, err := b.RemoveFrozen(res1.Root, func(string) bool { return false }); !ok || err != nil {
		t.Fatalf("remove: %v %v", ok, err)
	}
	b.WaitRemovals()
	if ids, _ := b.FrozenTrees(); len(ids) != 1 || ids[0] != res2.Root {
		t.Fatalf("frozen trees after removal: %v", ids)
	}

	must(unix.Mknod(filepath.Join(live, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	res3, err := delta.Scan(ctx, live, delta.ScanOptions{Saver: store, Translate: Translate})
	must(err)
	if _, err := b.Freeze(ctx, res3.Root, live, nil, store, nil); !errors.Is(err, ErrNotFreezable) {
		t.Fatalf("a device node was frozen: %v", err)
	}
	if b.HasFrozen(res3.Root) {
		t.Fatal("a failed freeze published a layer")
	}
}
