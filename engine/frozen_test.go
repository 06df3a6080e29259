package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"github.com/turnsnap/turnsnap/overlay"
	"github.com/turnsnap/turnsnap/overlay/frozen"
	"golang.org/x/sys/unix"
)

// These tests need root and overlayfs: they mount real sandboxes, stacked
// on frozen layers (lowerdir=FROZEN:BASE) and materialised, side by side.

// layerTurn changes a root in every way a layer records.
func layerTurn(t *testing.T, root string) {
	t.Helper()
	p := func(rel string) string { return filepath.Join(root, rel) }
	write(t, p("src/main.go"), "package main\n\nfunc main() { println(1) }\n")
	write(t, p("src/new/deep/file.txt"), strings.Repeat("new content\n", 5000))
	write(t, p("gone-later"), "in the layer only\n")
	must(t, os.Remove(p("src/lib/b.go")))     // whiteout
	must(t, os.RemoveAll(p("doomed")))        // whiteout of a dir ...
	must(t, os.Mkdir(p("doomed"), 0o700))     // ... recreated: opaque
	write(t, p("doomed/only"), "fresh\n")     //
	must(t, os.Chmod(p("etc/config"), 0o600)) // mode of a base file
	must(t, unix.Setxattr(p("src/main.go"), "user.k", []byte("v"), 0))
	must(t, os.Symlink("/etc/passwd", p("src/abs-link")))
	roottest.Move(t, p("deep/a"), p("moved"))            // a renamed base directory
	must(t, os.Link(p("src/main.go"), p("src/hard.go"))) // a hardlink in the layer
	roottest.Move(t, p("links/two"), p("links/three"))   // one name of a base hardlink
}

// branchTurn changes a branch of layerTurn's state: files of the frozen
// layer and of the base, deletions of both, residue, a new directory.
func branchTurn(t *testing.T, root, tag string) {
	t.Helper()
	p := func(rel string) string { return filepath.Join(root, rel) }
	write(t, p("src/main.go"), "package main // "+tag+"\n") // a layer file
	write(t, p("src/new/deep/file.txt"), "short "+tag+"\n") // a layer file in a layer dir
	must(t, os.Remove(p("gone-later")))                     // a layer-only file: no whiteout
	must(t, os.Remove(p("src/lib/a.go")))                   // a base file: whiteout
	write(t, p("doomed/only"), "again "+tag+"\n")           // in the opaque dir
	write(t, p("src/new/tmp"), "x")                         // residue in a layer dir ...
	must(t, os.Remove(p("src/new/tmp")))                    // ...
	write(t, p("fresh/"+tag), tag)                          // a new directory
	must(t, os.RemoveAll(p("moved")))                       // the renamed directory
	must(t, os.Chmod(p("src/new/deep/file.txt"), 0o640))    // metadata of a layer file
	must(t, os.Symlink("main.go", p("src/new/link-"+tag)))  // a new symlink
	write(t, p("links/one"), "base link written "+tag+"\n") // through a base hardlink
	must(t, os.Remove(p("etc/config")))                     // a copied-up base file
	// The same turn twice must give the same state: pin the times it moved.
	ts := []unix.Timespec{{Sec: 1600000000}, {Sec: 1600000000}}
	for _, rel := range []string{"src/main.go", "src/new/deep/file.txt", "src/new/deep", "src/new/link-" + tag,
		"src/new", "src/lib", "src", "doomed/only", "doomed", "fresh/" + tag, "fresh", "etc", "links/one"} {
		must(t, unix.UtimesNanoAt(unix.AT_FDCWD, p(rel), ts, unix.AT_SYMLINK_NOFOLLOW))
	}
}

func scanOf(t *testing.T, e *Engine, name string) *fstree.ScanResult {
	t.Helper()
	st, err := e.loadSandbox(context.Background(), delta.SandboxName(name))
	must(t, err)
	res, err := st.root.Scan(context.Background(), nil)
	must(t, err)
	return res
}

func TestBranchStacksOnFrozenLayer(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	layerTurn(t, cr.Root)
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	ob := overlayOf(e)
	cp1, err := e.resolveFor(ctx, "", mustRef(c1.ID.String()))
	must(t, err)
	e.WaitFreezes()
	if !ob.Layers().Has(cp1.FSTree) {
		t.Fatalf("checkpoint %s left no frozen layer", c1.ID.Short())
	}
	want := mergedState(t, cr.Root)

	st, err := e.Branch(ctx, mustRef(c1.ID.String()), "stacked", BranchOptions{})
	must(t, err)
	mat, err := e.Branch(ctx, mustRef(c1.ID.String()), "copied", BranchOptions{Materialise: true})
	must(t, err)
	if overlay.FrozenUser(e.home.sandboxDir("stacked")) != ob.Layers().Dir(cp1.FSTree) {
		t.Fatal("the branch does not stack on the checkpoint's frozen layer")
	}
	if overlay.FrozenUser(e.home.sandboxDir("copied")) != "" {
		t.Fatal("a materialised branch stacks")
	}
	for _, r := range []string{st.Root, mat.Root} {
		if got := mergedState(t, r); got != want {
			t.Fatalf("branch %s hashes to %s, want %s", r, got.Short(), want.Short())
		}
	}
	for _, n := range []string{"stacked", "copied"} {
		if res := scanOf(t, e, n); res.Root != cp1.FSTree || res.StateKey != cp1.StateKey {
			t.Fatalf("branch %s scans to %s (key %s), checkpoint has %s (key %s)", n, res.Root.Short(), res.StateKey.Short(), cp1.FSTree.Short(), cp1.StateKey.Short())
		}
		if r, err := e.Checkpoint(ctx, delta.SandboxName(n), CheckpointOptions{}); err != nil || r.Class != delta.ClassSkip {
			t.Fatalf("untouched branch %s: %v, class %v", n, err, r)
		}
	}

	// The same changes in both give the same tree: the stacked scan is
	// composed onto the frozen tree exactly as the copy records them.
	branchTurn(t, st.Root, "b")
	branchTurn(t, mat.Root, "b")
	if mergedState(t, st.Root) != mergedState(t, mat.Root) {
		t.Fatal("the same turn left different files in a stacked and a materialised branch")
	}
	sc, err := e.Checkpoint(ctx, "stacked", CheckpointOptions{})
	must(t, err)
	mc, err := e.Checkpoint(ctx, "copied", CheckpointOptions{})
	must(t, err)
	scp, _ := e.resolveFor(ctx, "", mustRef(sc.ID.String()))
	mcp, _ := e.resolveFor(ctx, "", mustRef(mc.ID.String()))
	if scp.FSTree != mcp.FSTree || scp.StateKey != mcp.StateKey {
		t.Fatalf("stacked branch checkpoints tree %s key %s, materialised %s key %s",
			scp.FSTree.Short(), scp.StateKey.Short(), mcp.FSTree.Short(), mcp.StateKey.Short())
	}
	if got := mergedState(t, cr.Root); got != want {
		t.Fatal("a branch's turn changed its origin")
	}
	branchWant := mergedState(t, st.Root)

	// A branch of the stacked branch stacks on the branch's own layer.
	bb, err := e.Branch(ctx, mustRef(sc.ID.String()), "bb", BranchOptions{})
	must(t, err)
	if overlay.FrozenUser(e.home.sandboxDir("bb")) != ob.Layers().Dir(scp.FSTree) {
		t.Fatal("a branch of a branch does not stack on its checkpoint's layer")
	}
	if got := mergedState(t, bb.Root); got != branchWant {
		t.Fatalf("branch of branch hashes to %s, want %s", got.Short(), branchWant.Short())
	}
	if res := scanOf(t, e, "bb"); res.Root != scp.FSTree || res.StateKey != scp.StateKey {
		t.Fatal("branch of branch does not scan to its checkpoint's tree")
	}
	// Independent edits never leak: into the branch, its branch, the origin.
	write(t, filepath.Join(bb.Root, "src/main.go"), "bb only")
	write(t, filepath.Join(st.Root, "doomed/only"), "stacked only")
	write(t, filepath.Join(cr.Root, "src/new/deep/file.txt"), "origin only")
	for _, c := range []struct{ root, rel, want string }{
		{bb.Root, "src/main.go", "bb only"}, {bb.Root, "doomed/only", "again b\n"},
		{st.Root, "src/main.go", "package main // b\n"}, {st.Root, "doomed/only", "stacked only"},
		{cr.Root, "src/main.go", "package main\n\nfunc main() { println(1) }\n"}, {cr.Root, "doomed/only", "fresh\n"},
		{bb.Root, "src/new/deep/file.txt", "short b\n"}, {mat.Root, "src/new/deep/file.txt", "short b\n"},
	} {
		if data, err := os.ReadFile(filepath.Join(c.root, c.rel)); err != nil || string(data) != c.want {
			t.Fatalf("%s/%s = %q (%v), want %q", c.root, c.rel, data, err, c.want)
		}
	}
	bbc, err := e.Checkpoint(ctx, "bb", CheckpointOptions{})
	must(t, err)
	if bbc.Class != delta.ClassFS {
		t.Fatalf("an edit in a branch of a branch classed %s", bbc.Class)
	}

	// Renames in a stacked root (of a frozen layer's directory, of a base
	// directory merged with one) record the state a copy restores.
	bs, err := e.Branch(ctx, mustRef(sc.ID.String()), "renames", BranchOptions{})
	must(t, err)
	roottest.Move(t, filepath.Join(bs.Root, "src/new"), filepath.Join(bs.Root, "renamed-layer-dir"))
	roottest.Move(t, filepath.Join(bs.Root, "src"), filepath.Join(bs.Root, "renamed-merged-dir"))
	roottest.Move(t, filepath.Join(bs.Root, "doomed"), filepath.Join(bs.Root, "renamed-opaque-dir"))
	rc, err := e.Checkpoint(ctx, "renames", CheckpointOptions{})
	must(t, err)
	copyOf, err := e.Branch(ctx, mustRef(rc.ID.String()), "renames-copy", BranchOptions{Materialise: true})
	must(t, err)
	if a, b := mergedState(t, bs.Root), mergedState(t, copyOf.Root); a != b {
		t.Fatalf("renames in a stacked root: checkpoint restores to %s, the root is %s", b.Short(), a.Short())
	}
	if res := scanOf(t, e, "renames-copy"); res.StateKey != scanOf(t, e, "renames").StateKey {
		t.Fatal("renames: the copy's state key differs from the stacked root's")
	}

	// Rollback of a stacked branch: to a checkpoint of another line, and
	// back to its own; the root is a plain one afterwards.
	if _, err := e.Rollback(ctx, "bb", mustRef(sc.ID.String()), RollbackOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := mergedState(t, bb.Root); got != branchWant {
		t.Fatal("rollback of a stacked branch did not restore its checkpoint")
	}
	if _, err := e.Rollback(ctx, "bb", mustRef(bbc.ID.String()), RollbackOptions{}); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(bb.Root, "src/main.go")); string(data) != "bb only" {
		t.Fatalf("rollback to the branch's own checkpoint: %q", data)
	}
	must(t, e.RemoveSandbox(ctx, "stacked"))
	checkAll(t, e)
}

func frozenSet(t *testing.T, e *Engine) map[delta.ID]bool {
	t.Helper()
	e.WaitFreezes()
	ids, err := overlayOf(e).Layers().Trees()
	must(t, err)
	out := map[delta.ID]bool{}
	for _, id := range ids {
		out[id] = true
	}
	return out
}

func TestBranchManyAndFrozenRetention(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	var cps []*delta.Checkpoint
	turn := func(name, root, content string) *delta.Checkpoint {
		t.Helper()
		write(t, filepath.Join(root, "work", content), content)
		r, err := e.Checkpoint(ctx, delta.SandboxName(name), CheckpointOptions{})
		must(t, err)
		cp, err := e.resolveFor(ctx, "", mustRef(r.ID.String()))
		must(t, err)
		return cp
	}
	for _, c := range []string{"one", "two", "three"} {
		cps = append(cps, turn("s", cr.Root, c))
	}
	if got := frozenSet(t, e); len(got) != frozen.DefaultKeep || !got[cps[2].FSTree] || !got[cps[1].FSTree] {
		t.Fatalf("frozen layers after 3 turns: %v, want the newest %d", got, frozen.DefaultKeep)
	}

	names, err := BranchNames("b", 8)
	must(t, err)
	rs, err := e.BranchMany(ctx, mustRef(cps[2].ID.String()), sandboxNames(names), BranchOptions{})
	must(t, err)
	want := mergedState(t, cr.Root)
	for i, r := range rs {
		if r.Sandbox != names[i] || overlay.FrozenUser(e.home.sandboxDir(delta.SandboxName(r.Sandbox))) == "" {
			t.Fatalf("fan-out branch %d (%s) does not stack", i, r.Sandbox)
		}
		if got := mergedState(t, r.Root); got != want {
			t.Fatalf("fan-out branch %s hashes to %s, want %s", r.Sandbox, got.Short(), want.Short())
		}
	}
	// All or none: one taken name fails the whole fan-out, before anything.
	if _, err := e.BranchMany(ctx, mustRef(cps[2].ID.String()), sandboxNames([]string{"new1", "b-3"}), BranchOptions{}); err == nil {
		t.Fatal("a fan-out onto an existing sandbox succeeded")
	}
	if _, err := e.BranchMany(ctx, mustRef(cps[2].ID.String()), sandboxNames([]string{"x", "x"}), BranchOptions{}); err == nil {
		t.Fatal("a fan-out with a name twice succeeded")
	}
	if _, err := e.SandboxPath(ctx, "new1"); err == nil {
		t.Fatal("a failed fan-out left a sandbox")
	}
	// A checkpoint whose layer is no longer kept gets it built again for
	// its branch, which stacks on it.
	ob := overlayOf(e)
	if ob.Layers().Has(cps[0].FSTree) {
		t.Fatal("the oldest checkpoint's layer is still kept")
	}
	old, err := e.Branch(ctx, mustRef(cps[0].ID.String()), "old", BranchOptions{})
	must(t, err)
	if overlay.FrozenUser(e.home.sandboxDir("old")) != ob.Layers().Dir(cps[0].FSTree) {
		t.Fatal("branch of a pruned layer does not stack on one built for it")
	}
	if _, err := os.Stat(filepath.Join(old.Root, "work/one")); err != nil {
		t.Fatal(err)
	}
	must(t, e.RemoveSandbox(ctx, "old"))

	// b-1 moves on twice and s twice: cps[2]'s layer is on no line's
	// newest two any more, but b-1 (and the others) still stack on it.
	for _, n := range names[1:] {
		must(t, e.RemoveSandbox(ctx, delta.SandboxName(n)))
	}
	b1 := rs[0].Root
	turn("b-1", b1, "b1-a")
	turn("b-1", b1, "b1-b")
	turn("s", cr.Root, "four")
	turn("s", cr.Root, "five")
	must(t, overlayOf(e).PruneFrozen(ctx))
	if !frozenSet(t, e)[cps[2].FSTree] {
		t.Fatal("a layer a live branch stacks on was pruned")
	}
	if data, err := os.ReadFile(filepath.Join(b1, "work/three")); err != nil || string(data) != "three" {
		t.Fatalf("stacked branch after its origin moved on: %q %v", data, err)
	}
	must(t, e.RemoveSandbox(ctx, "b-1"))
	if frozenSet(t, e)[cps[2].FSTree] {
		t.Fatal("removing the last branch on a layer kept the layer")
	}
	if got := frozenSet(t, e); len(got) != frozen.DefaultKeep {
		t.Fatalf("frozen layers at the end: %d, want %d (s's newest)", len(got), frozen.DefaultKeep)
	}
	checkAll(t, e)
}

// TestVerifyChecksTheFrozenLayer: verify re-hashes the checkpoint's frozen
// layer on this host (its branches stack on it and read it as it is), and
// a byte changed in it fails the verify as corrupt, naming the layer.
func TestVerifyChecksTheFrozenLayer(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	write(t, filepath.Join(cr.Root, "work/notes.txt"), "the agent's notes\n")
	res, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	c, err := e.Resolve(ctx, mustRef(res.ID.String()))
	must(t, err)
	e.WaitFreezes()
	rep, err := e.Verifier().Verify(ctx, mustRef(c.ID.String()))
	must(t, err)
	if !rep.FrozenChecked {
		t.Fatal("verify did not check the frozen layer")
	}
	layer := filepath.Join(overlayOf(e).Layers().Dir(c.FSTree), "work/notes.txt")
	data, err := os.ReadFile(layer)
	must(t, err)
	data[0] ^= 1
	must(t, os.WriteFile(layer, data, 0o644))
	_, err = e.Verifier().Verify(ctx, mustRef(c.ID.String()))
	if !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), "frozen layer") {
		t.Fatalf("verify of a damaged frozen layer: %v", err)
	}
	must(t, os.RemoveAll(overlayOf(e).Layers().Dir(c.FSTree)))
}
