package roottest

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
	"golang.org/x/sys/unix"
)

func testLifecycle(t *testing.T, s Setup) {
	f := newFixture(t, s)
	r, dir := f.create("sb", f.s.IDs.EmptyTree())
	root := r.Path()
	if got := Merged(t, root); got != Merged(t, f.base) {
		t.Fatalf("new root hashes to %s, base to %s", got.Short(), Merged(t, f.base).Short())
	}
	must(t, r.Mount(f.ctx))
	must(t, r.Mount(f.ctx))
	if n := mounts(t, root); n != 1 {
		t.Fatalf("after mounting twice, %d mounts on %s", n, root)
	}
	Write(t, filepath.Join(root, "new.txt"), "hello")
	must(t, r.Unmount(f.ctx))
	must(t, r.Unmount(f.ctx))
	if exists(filepath.Join(root, "new.txt")) || exists(filepath.Join(root, "src")) {
		t.Fatal("root still shows files after unmount")
	}
	// A reboot: a fresh handle on the same directory brings it all back.
	r2 := s.Backend.Open(dir, f.lower)
	if r2.Path() != root {
		t.Fatalf("reopened root path %s, want %s", r2.Path(), root)
	}
	must(t, r2.Mount(f.ctx))
	if data, err := os.ReadFile(filepath.Join(root, "new.txt")); err != nil || string(data) != "hello" {
		t.Fatalf("after remount new.txt = %q, %v", data, err)
	}
	res, err := r2.Scan(f.ctx, f.store)
	must(t, err)
	if e := f.entryAt(res.Root, "new.txt"); e == nil || e.Type != delta.TypeFile || e.Size != 5 {
		t.Fatalf("scan after remount: new.txt entry %+v", e)
	}
}

func testScanCapturesEveryChange(t *testing.T, s Setup) {
	f := newFixture(t, s)
	r, _ := f.create("sb", f.s.IDs.EmptyTree())
	AgentTurn(t, r.Path())
	want := Merged(t, r.Path())
	res := f.checkpoint(r)
	if res.Root == f.s.IDs.EmptyTree() || res.StateKey == f.s.IDs.EmptyTree() {
		t.Fatal("a turn with edits scanned as an empty layer")
	}
	// base + layer is exactly the live state: a root made from the layer
	// alone shows the same filesystem.
	r2, _ := f.create("copy", res.Root)
	if got := Merged(t, r2.Path()); got != want {
		t.Fatalf("root restored from the layer hashes to %s, the original to %s", got.Short(), want.Short())
	}
	res2, err := r2.Scan(f.ctx, nil)
	must(t, err)
	if res2.StateKey != res.StateKey {
		t.Fatalf("restored root scans to state key %s, want %s", res2.StateKey.Short(), res.StateKey.Short())
	}
}

func testScanLayerForm(t *testing.T, s Setup) {
	f := newFixture(t, s)
	r, _ := f.create("sb", f.s.IDs.EmptyTree())
	p := func(rel string) string { return filepath.Join(r.Path(), rel) }
	Write(t, p("new/n.txt"), "new")
	Write(t, p("src/main.go"), "package main // changed\n")
	must(t, os.Remove(p("src/lib/b.go")))
	must(t, os.RemoveAll(p("doomed")))
	must(t, os.Mkdir(p("doomed"), 0o755))
	Write(t, p("doomed/only"), "fresh")
	Move(t, p("etc/config"), p("etc/config2"))
	must(t, os.Link(p("new/n.txt"), p("new/n2.txt")))
	must(t, os.Symlink("../src/main.go", p("new/sym")))
	must(t, os.Chmod(p("deep/a/b/c/file"), 0o600))
	res := f.checkpoint(r)
	check := func(rel string, ok func(e *delta.Entry) bool, what string) {
		t.Helper()
		if e := f.entryAt(res.Root, rel); !ok(e) {
			t.Errorf("layer entry %s = %+v, want %s", rel, e, what)
		}
	}
	check("new/n.txt", func(e *delta.Entry) bool { return e != nil && e.Type == delta.TypeFile && e.Size == 3 }, "a 3-byte file")
	check("new/n2.txt", func(e *delta.Entry) bool { return e != nil && e.Type == delta.TypeHardlink && e.Target == "new/n.txt" }, "a hardlink to new/n.txt")
	check("new/sym", func(e *delta.Entry) bool {
		return e != nil && e.Type == delta.TypeSymlink && e.Target == "../src/main.go"
	}, "a symlink")
	check("src/main.go", func(e *delta.Entry) bool { return e != nil && e.Type == delta.TypeFile && e.Size == 24 }, "the changed file")
	check("src/lib/b.go", func(e *delta.Entry) bool { return e != nil && e.Type == delta.TypeWhiteout }, "a whiteout")
	check("src/lib/a.go", func(e *delta.Entry) bool { return e == nil }, "absent (untouched)")
	check("src/link", func(e *delta.Entry) bool { return e == nil }, "absent (untouched)")
	check("doomed", func(e *delta.Entry) bool { return e != nil && e.Type == delta.TypeDir && e.Opaque }, "an opaque directory")
	check("doomed/only", func(e *delta.Entry) bool { return e != nil && e.Type == delta.TypeFile }, "a file")
	check("etc/config", func(e *delta.Entry) bool { return e != nil && e.Type == delta.TypeWhiteout }, "a whiteout (renamed away)")
	check("etc/config2", func(e *delta.Entry) bool {
		return e != nil && e.Type == delta.TypeFile && len(e.Xattrs) == 1 && string(e.Xattrs[0].Value) == "base"
	}, "the renamed file with its xattr")
	check("deep/a/b/c/file", func(e *delta.Entry) bool { return e != nil && e.Mode == 0o600 }, "mode 0600")
	check("links", func(e *delta.Entry) bool { return e == nil }, "absent (untouched)")
}

func testUnchangedTurns(t *testing.T, s Setup) {
	f := newFixture(t, s)
	r, _ := f.create("sb", f.s.IDs.EmptyTree())
	root := r.Path()
	for i := range 20 {
		Write(t, filepath.Join(root, "work", strings.Repeat("f", i+1)), strings.Repeat("data", 50*i))
	}
	Settle()
	cp := f.checkpoint(r)
	Settle()
	for i := range 2 {
		res, err := r.Scan(f.ctx, f.store)
		must(t, err)
		if res.Root != cp.Root || res.StateKey != cp.StateKey || res.Stats.FilesRead != 0 {
			t.Fatalf("no-op scan %d: tree %s key %s, %d files read; want %s %s 0",
				i, res.Root.Short(), res.StateKey.Short(), res.Stats.FilesRead, cp.Root.Short(), cp.StateKey.Short())
		}
	}
	// A temp file created and deleted, in a base directory and in a layer
	// directory, changes directory mtimes only.
	Write(t, filepath.Join(root, "tmp/scratch"), "x")
	must(t, os.Remove(filepath.Join(root, "tmp/scratch")))
	Write(t, filepath.Join(root, "work/scratch"), "x")
	must(t, os.Remove(filepath.Join(root, "work/scratch")))
	must(t, os.Mkdir(filepath.Join(root, "src/tmpdir"), 0o755))
	must(t, os.Remove(filepath.Join(root, "src/tmpdir")))
	for i := range 2 {
		res, err := r.Scan(f.ctx, f.store)
		must(t, err)
		if res.StateKey != cp.StateKey || res.Stats.FilesRead != 0 {
			t.Fatalf("temp-file scan %d: key %s (want %s), %d files read", i, res.StateKey.Short(), cp.StateKey.Short(), res.Stats.FilesRead)
		}
	}
	Write(t, filepath.Join(root, "work/f"), "changed")
	res, err := r.Scan(f.ctx, f.store)
	must(t, err)
	if res.StateKey == cp.StateKey {
		t.Fatal("a real change kept the state key")
	}
}

func testIncremental(t *testing.T, s Setup) {
	f := newFixture(t, s)
	r, _ := f.create("sb", f.s.IDs.EmptyTree())
	root := r.Path()
	for i := range 100 {
		Write(t, filepath.Join(root, "work", "d"+string(rune('a'+i%5)), "f"+strings.Repeat("x", i/5)), strings.Repeat("content", i))
	}
	Settle()
	cp := f.checkpoint(r)
	if cp.Stats.FilesRead == 0 {
		t.Fatal("first scan read no files")
	}
	Settle()
	Write(t, filepath.Join(root, "work/dc/fxx"), "changed")
	Write(t, filepath.Join(root, "src/lib/a.go"), "package lib // changed\n")
	Settle()
	res, err := r.Scan(f.ctx, f.store)
	must(t, err)
	if res.Stats.FilesRead != 2 {
		t.Fatalf("scan after changing 2 files read %d files", res.Stats.FilesRead)
	}
	if res.Root == cp.Root {
		t.Fatal("changes did not change the tree")
	}
	must(t, r.Committed(res))
	Settle()
	res, err = r.Scan(f.ctx, f.store)
	must(t, err)
	if res.Stats.FilesRead != 0 {
		t.Fatalf("no-op scan after commit read %d files", res.Stats.FilesRead)
	}
}

func testRestoreEarlierTrees(t *testing.T, s Setup) {
	f := newFixture(t, s)
	r, _ := f.create("sb", f.s.IDs.EmptyTree())
	root := r.Path()
	h0 := Merged(t, root)
	AgentTurn(t, root)
	Settle()
	a := f.checkpoint(r)
	ha := Merged(t, root)
	must(t, os.RemoveAll(filepath.Join(root, "src")))
	Write(t, filepath.Join(root, "etc/config"), "clobbered")
	Move(t, filepath.Join(root, "moved"), filepath.Join(root, "deep/again"))
	Write(t, filepath.Join(root, "doomed/only"), "changed again")
	Settle()
	b := f.checkpoint(r)
	hb := Merged(t, root)
	for _, step := range []struct {
		name string
		res  *fstree.ScanResult
		want delta.ID
	}{
		{"A", a, ha}, {"B", b, hb}, {"empty", &fstree.ScanResult{Root: f.s.IDs.EmptyTree(), StateKey: f.s.IDs.EmptyTree()}, h0}, {"A again", a, ha},
	} {
		must(t, r.Restore(f.ctx, step.res.Root, f.store))
		if got := Merged(t, root); got != step.want {
			t.Fatalf("restore %s: root hashes to %s, want %s", step.name, got.Short(), step.want.Short())
		}
		Settle()
		res, err := r.Scan(f.ctx, f.store)
		must(t, err)
		if res.StateKey != step.res.StateKey || res.Stats.FilesRead != 0 {
			t.Fatalf("restore %s: scan gives key %s (want %s), %d files read", step.name,
				res.StateKey.Short(), step.res.StateKey.Short(), res.Stats.FilesRead)
		}
	}
	// Work goes on from the restored state.
	Write(t, filepath.Join(root, "after"), "restore")
	c := f.checkpoint(r)
	want := Merged(t, root)
	r2, _ := f.create("check", c.Root)
	if got := Merged(t, r2.Path()); got != want {
		t.Fatalf("checkpoint after restore does not restore: %s vs %s", got.Short(), want.Short())
	}
}

func testRestoreIntoNewRoot(t *testing.T, s Setup) {
	f := newFixture(t, s)
	r, _ := f.create("sb", f.s.IDs.EmptyTree())
	AgentTurn(t, r.Path())
	a := f.checkpoint(r)
	ha := Merged(t, r.Path())
	br, _ := f.create("branch", a.Root)
	if got := Merged(t, br.Path()); got != ha {
		t.Fatalf("branch hashes to %s, want %s", got.Short(), ha.Short())
	}
	Write(t, filepath.Join(br.Path(), "only-in-branch"), "b")
	must(t, os.Remove(filepath.Join(br.Path(), "src/main.go")))
	if got := Merged(t, r.Path()); got != ha {
		t.Fatal("writing into the branch changed the original")
	}
	bres := f.checkpoint(br)
	if e := f.entryAt(bres.Root, "only-in-branch"); e == nil {
		t.Fatal("branch scan misses its own change")
	}
}

func testRestoreCorrupt(t *testing.T, s Setup) {
	f := newFixture(t, s)
	r, _ := f.create("sb", f.s.IDs.EmptyTree())
	Write(t, filepath.Join(r.Path(), "state"), "the state to keep")
	st := f.checkpoint(r)
	hs := Merged(t, r.Path())
	// Another tree whose one new file's chunk is corrupt in the store.
	other, _ := f.create("other", f.s.IDs.EmptyTree())
	body := strings.Repeat("the other state ", 100)
	Write(t, filepath.Join(other.Path(), "other"), body)
	must(t, os.Remove(filepath.Join(other.Path(), "src/main.go")))
	ot, err := other.Scan(f.ctx, f.store)
	must(t, err)
	f.store.Corrupt(f.s.IDs.Hash([]byte(body)))
	err = r.Restore(f.ctx, ot.Root, f.store)
	if !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("restore of a corrupt tree: %v, want an ErrCorrupt error", err)
	}
	must(t, r.Mount(f.ctx))
	if got := Merged(t, r.Path()); got != hs {
		t.Fatalf("after a failed restore the root hashes to %s, want the old %s", got.Short(), hs.Short())
	}
	res, err := r.Scan(f.ctx, f.store)
	must(t, err)
	if res.StateKey != st.StateKey {
		t.Fatal("after a failed restore the scan state moved")
	}
}

func testRemoveCleans(t *testing.T, s Setup) {
	f := newFixture(t, s)
	r, dir := f.create("sb", f.s.IDs.EmptyTree())
	AgentTurn(t, r.Path())
	a := f.checkpoint(r)
	Write(t, filepath.Join(r.Path(), "more"), "x")
	f.checkpoint(r)
	must(t, r.Restore(f.ctx, a.Root, f.store))
	root := r.Path()
	must(t, r.Remove(context.Background()))
	if exists(dir) {
		t.Fatalf("%s exists after Remove", dir)
	}
	var st unix.Stat_t
	if unix.Lstat(root, &st) == nil || mounts(t, root) != 0 {
		t.Fatalf("%s still there or mounted after Remove", root)
	}
	if s.Leftovers != nil {
		left, err := s.Leftovers()
		must(t, err)
		if len(left) != 0 {
			t.Fatalf("Remove left %v behind", left)
		}
	}
}
