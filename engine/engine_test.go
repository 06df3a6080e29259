package engine

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

func TestRollbackAndBranchGiveIdenticalTrees(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	root := cr.Root
	agentTurn(t, root)
	want := mergedState(t, root)
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	if c1.Class != delta.ClassFS {
		t.Fatalf("turn with edits classed %s", c1.Class)
	}
	// Overlay markers really are in the upper layer.
	g, _ := os.Readlink(filepath.Join(e.home.sandboxDir("s"), "current"))
	upper := filepath.Join(e.home.sandboxDir("s"), g, "upper")
	var st unix.Stat_t
	must(t, unix.Lstat(filepath.Join(upper, "src/lib/b.go"), &st))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Fatal("deleting a base file left no whiteout in the upper dir")
	}
	buf := make([]byte, 4)
	if n, err := unix.Lgetxattr(filepath.Join(upper, "doomed"), fstree.OpaqueXattr, buf); err != nil || string(buf[:n]) != "y" {
		t.Fatalf("recreated dir is not opaque in the upper dir: %v", err)
	}

	// Trash the sandbox in a second turn, then roll back.
	must(t, os.RemoveAll(filepath.Join(root, "src")))
	write(t, filepath.Join(root, "etc/config"), "clobbered")
	_, err = e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	if _, err := e.Rollback(ctx, "s", mustRef(c1.ID.String()), RollbackOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := mergedState(t, root); got != want {
		t.Fatalf("after rollback the root hashes to %s, want %s", got.Short(), want.Short())
	}
	data, err := os.ReadFile(filepath.Join(root, "doomed/only"))
	if err != nil || string(data) != "fresh\n" {
		t.Fatalf("opaque dir content after rollback: %q %v", data, err)
	}
	if _, err := os.Stat(filepath.Join(root, "doomed/x")); !os.IsNotExist(err) {
		t.Fatal("opaque dir let a lower entry through after rollback")
	}
	must(t, unix.Lstat(filepath.Join(root, "src/hard.go"), &st))
	if st.Nlink != 2 {
		t.Fatalf("hardlink count after rollback: %d", st.Nlink)
	}
	br, err := e.Branch(ctx, mustRef(c1.ID.Short()), "b", BranchOptions{})
	must(t, err)
	if got := mergedState(t, br.Root); got != want {
		t.Fatalf("branch root hashes to %s, want %s", got.Short(), want.Short())
	}
	// The branch runs beside its origin: changing one leaves the other alone.
	write(t, filepath.Join(br.Root, "only-in-branch"), "b")
	if got := mergedState(t, root); got != want {
		t.Fatal("writing into the branch changed the original sandbox")
	}
	bc, err := e.Checkpoint(ctx, "b", CheckpointOptions{})
	must(t, err)
	if bc.Parent != c1.ID {
		t.Fatalf("branch's first checkpoint has parent %s, want %s", bc.Parent.Short(), c1.ID.Short())
	}
	var kids []delta.ID
	must(t, e.view(ctx, func(tx *catalog.Tx) error { kids, err = tx.Children(c1.ID); return err }))
	if len(kids) != 2 {
		t.Fatalf("checkpoint %s has %d children, want 2 (the trashed turn and the branch's)", c1.ID.Short(), len(kids))
	}
	checkAll(t, e)
}

func TestUnchangedTurnsWriteNothing(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	for i := range 40 {
		write(t, filepath.Join(cr.Root, "work", string(rune('a'+i%26))+strings.Repeat("x", i)), strings.Repeat("data", 100*i))
	}
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	settle()
	objects := countObjects(t, e.stores.front)

	noop, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	settle()
	noop2, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	for _, r := range []*CheckpointResult{noop, noop2} {
		if r.Class != delta.ClassSkip || r.Stats.BytesNew != 0 || r.ID != c1.ID {
			t.Fatalf("no-op turn: class %s, %d new bytes, id %s (head %s)", r.Class, r.Stats.BytesNew, r.ID.Short(), c1.ID.Short())
		}
	}
	if noop2.Stats.FilesRead != 0 {
		t.Fatalf("no-op turn read %d unchanged files", noop2.Stats.FilesRead)
	}
	// A temp file created and deleted within a turn, in a base directory
	// (overlay copies the directory up) and in an upper one.
	write(t, filepath.Join(cr.Root, "tmp/scratch"), "x")
	must(t, os.Remove(filepath.Join(cr.Root, "tmp/scratch")))
	write(t, filepath.Join(cr.Root, "work/scratch"), "x")
	must(t, os.Remove(filepath.Join(cr.Root, "work/scratch")))
	tmp, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	if tmp.Class != delta.ClassSkip || tmp.Stats.BytesNew != 0 || tmp.Stats.FilesRead != 0 {
		t.Fatalf("temp-file turn: class %s, %d new bytes, %d files read", tmp.Class, tmp.Stats.BytesNew, tmp.Stats.FilesRead)
	}
	if n := countObjects(t, e.stores.front); n != objects {
		t.Fatalf("skip turns changed the store: %d objects, was %d", n, objects)
	}
	// One real change is noticed, and only that file is read.
	settle()
	write(t, filepath.Join(cr.Root, "work/a"), "changed")
	c2, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	if c2.Class != delta.ClassFS || c2.Stats.FilesRead != 1 || c2.Parent != c1.ID {
		t.Fatalf("one-file turn: class %s, %d files read, parent %s", c2.Class, c2.Stats.FilesRead, c2.Parent.Short())
	}
}

func TestSecondSandboxOnSameBaseAddsNoBytes(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	base := richBase(t)
	_, err := e.CreateSandbox(ctx, "one", CreateOptions{Base: base})
	must(t, err)
	before := countObjects(t, e.stores.front)
	r, err := e.CreateSandbox(ctx, "two", CreateOptions{Base: base})
	must(t, err)
	if c, err := e.Checkpoint(ctx, "two", CheckpointOptions{}); err != nil || c.Class != delta.ClassSkip {
		t.Fatalf("first turn of an untouched sandbox: %v, class %v", err, c)
	}
	if r.Checkpoint.Stats.BlobsNew != 0 || r.Checkpoint.Stats.ObjectsNew != 0 {
		t.Fatalf("second import stored %d blobs in %d packs", r.Checkpoint.Stats.BlobsNew, r.Checkpoint.Stats.ObjectsNew)
	}
	// One record, one sandbox description, one head ref: metadata only.
	if n := countObjects(t, e.stores.front); n != before+3 {
		t.Fatalf("store grew by %d objects, want 3 metadata objects", n-before)
	}
	if _, err := e.CreateSandbox(ctx, "two", CreateOptions{Base: base}); !errors.Is(err, errdefs.ErrExists) {
		t.Fatalf("duplicate name: %v", err)
	}
	if _, err := e.CreateSandbox(ctx, "../x", CreateOptions{Base: base}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := e.CreateSandbox(ctx, "x", CreateOptions{Base: "/nonexistent"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("missing base: %v", err)
	}
}

func TestRemountAfterReboot(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	write(t, filepath.Join(cr.Root, "kept"), "k")
	_, err = e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	must(t, unix.Unmount(cr.Root, 0)) // what a reboot does to the mount
	p, err := e.SandboxPath(ctx, "s")
	must(t, err)
	if b, err := os.ReadFile(filepath.Join(p, "kept")); err != nil || string(b) != "k" {
		t.Fatalf("after remount: %q %v", b, err)
	}
	must(t, unix.Unmount(cr.Root, 0))
	r, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	if r.Class != delta.ClassSkip {
		t.Fatalf("checkpoint after remount classed %s", r.Class)
	}
}

func TestDiff(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	write(t, filepath.Join(cr.Root, "src/main.go"), "changed")
	must(t, os.Remove(filepath.Join(cr.Root, "etc/config")))
	write(t, filepath.Join(cr.Root, "added"), "a")
	live, err := e.History().Diff(ctx, "s", mustRef(""), mustRef(""))
	must(t, err)
	got := map[string]delta.ChangeKind{}
	for _, c := range live.Changes {
		got[c.Path] = c.Kind
	}
	want := map[string]delta.ChangeKind{"src/main.go": delta.Modified, "etc/config": delta.Deleted, "added": delta.Added}
	for p, k := range want {
		if got[p] != k {
			t.Errorf("%s: got %c, want %c (all: %v)", p, got[p], k, live.Changes)
		}
	}
	if len(got) != len(want) {
		t.Errorf("diff has %d changes, want %d: %v", len(got), len(want), live.Changes)
	}
	c, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	between, err := e.History().Diff(ctx, "s", mustRef(cr.Checkpoint.ID.String()), mustRef(c.ID.String()))
	must(t, err)
	if len(between.Changes) != len(live.Changes) {
		t.Fatalf("checkpoint diff %v differs from live diff %v", between.Changes, live.Changes)
	}
}

func TestSecondProcessGetsClearLockError(t *testing.T) {
	e := newEngine(t)
	_, err := Open(context.Background(), Options{Home: e.Home(), LockWait: 100 * time.Millisecond})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "in use by another turnsnap process") ||
		!strings.Contains(err.Error(), "pid ") {
		t.Fatalf("second open: %v", err)
	}
}

// A sandbox whose root lives where this host cannot reach (a btrfs pool of
// another host) can still be forgotten.
func TestRemoveSandboxWithUnreachableRoot(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	must(t, e.cat.Update(ctx, func(tx *catalog.Tx) error {
		return tx.PutSandbox(&delta.Sandbox{Name: "elsewhere", Backend: "btrfs", BaseTree: cr.Sandbox.BaseTree,
			Config: json.RawMessage(`{"pool":"/nonexistent/pool"}`), Created: time.Now().UTC()})
	}))
	if err := e.RemoveSandbox(ctx, "elsewhere"); err != nil {
		t.Fatalf("remove: %v", err)
	}
	sbs, err := e.ListSandboxes(ctx)
	must(t, err)
	if len(sbs) != 1 || sbs[0].Sandbox.Name != "s" {
		t.Fatalf("sandboxes after remove: %+v", sbs)
	}
}
