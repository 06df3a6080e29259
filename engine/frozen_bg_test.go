package engine

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/room"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/overlay"
	"github.com/turnsnap/turnsnap/overlay/frozen"
	"golang.org/x/sys/unix"
)

// holdFreeze makes the engine's next freeze stop when it starts: started
// is closed once it is there, and it goes on when release is called (the
// test's point to act while the freeze is in flight). Later freezes pass.
// A test that fails first still releases it (Close waits for the freeze).
func holdFreeze(t *testing.T, e *Engine) (started <-chan struct{}, release func()) {
	at, rel := make(chan struct{}), make(chan struct{})
	held := false
	e.opts.AtPhase = func(p string) {
		if p != frozen.PhaseStart || held {
			return
		}
		held = true
		close(at)
		<-rel
	}
	release = sync.OnceFunc(func() { close(rel) })
	t.Cleanup(release)
	return at, release
}

// waitHeld waits for a held freeze to start.
func waitHeld(t *testing.T, started <-chan struct{}) {
	t.Helper()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the freeze never started")
	}
}

// TestBranchWaitsForBackgroundFreeze: the checkpoint returns while its
// layer is still being frozen (the freeze is held at its start), and a
// branch made at that moment waits for the freeze and stacks on the layer
// instead of copying it.
func TestBranchWaitsForBackgroundFreeze(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	layerTurn(t, cr.Root)
	started, release := holdFreeze(t, e)
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err) // returned with the freeze held: the turn does not wait for it
	waitHeld(t, started)
	cp1, err := e.resolveFor(ctx, "", mustRef(c1.ID.String()))
	must(t, err)
	ob := overlayOf(e)
	if ob.Layers().Has(cp1.FSTree) {
		t.Fatal("the layer exists while its freeze is held")
	}
	want := mergedState(t, cr.Root)
	waited := overlayOf(e).Keeper().Waited()
	type result struct {
		r   *RestoreResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := e.Branch(ctx, mustRef(c1.ID.String()), "b", BranchOptions{})
		done <- result{r, err}
	}()
	for deadline := time.Now().Add(30 * time.Second); overlayOf(e).Keeper().Waited() == waited; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the branch never found the freeze pending")
		}
	}
	select {
	case res := <-done:
		t.Fatalf("the branch finished while the freeze was held: %v", res.err)
	default:
	}
	release()
	res := <-done
	must(t, res.err)
	if got := overlay.FrozenUser(e.home.sandboxDir("b")); got != ob.Layers().Dir(cp1.FSTree) {
		t.Fatalf("the branch made during the freeze stacks on %q, want the checkpoint's layer", got)
	}
	if got := mergedState(t, res.r.Root); got != want {
		t.Fatalf("branch hashes to %s, want %s", got.Short(), want.Short())
	}
	checkAll(t, e)
}

// TestFreezeIgnoresEditsAfterTheCut: the sandbox changes files after its
// checkpoint and before the background freeze reads them (made to happen
// mid-freeze by the hook): bytes of the same size, a mode, an xattr, a
// directory swapped for a symlink, a file swapped for a hardlink of
// another. None of it reaches the frozen layer: it hashes to the
// checkpoint's tree, and a branch of it sees the checkpoint's files.
func TestFreezeIgnoresEditsAfterTheCut(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	base := t.TempDir()
	write(t, filepath.Join(base, "base.txt"), "base\n")
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: base})
	must(t, err)
	p := func(rel string) string { return filepath.Join(cr.Root, rel) }
	write(t, p("a/same-size"), strings.Repeat("A", 100000))
	write(t, p("a/mode"), "mode\n")
	write(t, p("a/xattr"), "xattr\n")
	write(t, p("dir/inside"), "inside\n")
	write(t, p("linked"), "its own bytes\n")
	write(t, p("other"), "other bytes!!\n")
	_, err = e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	e.WaitFreezes()
	// The second turn's layer is built from the first's: change the files
	// in this turn so the freeze must take them from the live root.
	write(t, p("a/same-size"), strings.Repeat("B", 100000))
	write(t, p("a/mode"), "mode 2\n")
	write(t, p("a/xattr"), "xattr 2\n")
	write(t, p("dir/inside"), "inside 2\n")
	write(t, p("linked"), "its own 2\n")
	want := mergedState(t, cr.Root)
	started, release := holdFreeze(t, e)
	c2, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	waitHeld(t, started)
	write(t, p("a/same-size"), strings.Repeat("C", 100000))
	must(t, os.Chmod(p("a/mode"), 0o600))
	must(t, unix.Setxattr(p("a/xattr"), "user.after", []byte("cut"), 0))
	must(t, os.RemoveAll(p("dir")))
	must(t, os.Symlink("/etc", p("dir")))
	must(t, os.Remove(p("linked")))
	must(t, os.Link(p("other"), p("linked")))
	release()
	e.WaitFreezes()
	cp2, err := e.resolveFor(ctx, "", mustRef(c2.ID.String()))
	must(t, err)
	ob := overlayOf(e)
	if !ob.Layers().Has(cp2.FSTree) {
		t.Fatal("no layer frozen")
	}
	got, err := fstree.Scan(ctx, ob.Layers().Dir(cp2.FSTree), fstree.ScanOptions{Translate: overlay.Translate})
	must(t, err)
	if got.Root != cp2.FSTree {
		t.Fatalf("the frozen layer hashes to %s, the checkpoint's tree is %s: an edit after the cut leaked", got.Root.Short(), cp2.FSTree.Short())
	}
	b, err := e.Branch(ctx, mustRef(c2.ID.String()), "b", BranchOptions{})
	must(t, err)
	if overlay.FrozenUser(e.home.sandboxDir("b")) == "" {
		t.Fatal("the branch does not stack")
	}
	if got := mergedState(t, b.Root); got != want {
		t.Fatalf("the branch hashes to %s, the checkpoint's state is %s", got.Short(), want.Short())
	}
	if data, _ := os.ReadFile(filepath.Join(b.Root, "a/same-size")); string(data[:1]) != "B" {
		t.Fatalf("the branch holds bytes written after the cut: %q...", data[:1])
	}
}

// TestIncrementalFreezeOnTheLine: turn after turn, each layer from the
// third on is made from the line's layer no longer kept (the same
// directory, only the names that differ changed), every layer hashes to
// its tree, and the layers kept stay frozen.DefaultKeep.
func TestIncrementalFreezeOnTheLine(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	for i := range 30 {
		write(t, filepath.Join(cr.Root, "keep", string(rune('a'+i%5)), string(rune('a'+i))), strings.Repeat("k", i))
	}
	ob := overlayOf(e)
	ino := func(dir string) uint64 {
		var st unix.Stat_t
		if unix.Stat(dir, &st) != nil {
			return 0
		}
		return st.Ino
	}
	var last string
	for i := range 6 {
		write(t, filepath.Join(cr.Root, "work", string(rune('a'+i)), "f"), strings.Repeat("x", i+1))
		if i >= 2 {
			must(t, os.RemoveAll(filepath.Join(cr.Root, "work", string(rune('a'+i-2)))))
			must(t, os.Chmod(filepath.Join(cr.Root, "work"), 0o700+os.FileMode(i%2)*0o50))
		}
		unkept := map[uint64]bool{}
		for id := range frozenSet(t, e) {
			unkept[ino(ob.Layers().Dir(id))] = true
		}
		c, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
		must(t, err)
		last = c.ID.String()
		e.WaitFreezes()
		cp, err := e.resolveFor(ctx, "", mustRef(c.ID.String()))
		must(t, err)
		got, err := fstree.Scan(ctx, ob.Layers().Dir(cp.FSTree), fstree.ScanOptions{Translate: overlay.Translate})
		must(t, err)
		if got.Root != cp.FSTree {
			t.Fatalf("turn %d: layer hashes to %s, tree %s", i, got.Root.Short(), cp.FSTree.Short())
		}
		if reused := unkept[ino(ob.Layers().Dir(cp.FSTree))]; reused != (i >= 2) {
			t.Fatalf("turn %d: layer made from an older one: %v", i, reused)
		}
		if n := len(frozenSet(t, e)); n != min(i+1, frozen.DefaultKeep) {
			t.Fatalf("turn %d: %d layers kept", i, n)
		}
	}
	b, err := e.Branch(ctx, mustRef(last), "b", BranchOptions{})
	must(t, err)
	if overlay.FrozenUser(e.home.sandboxDir("b")) == "" || mergedState(t, b.Root) != mergedState(t, cr.Root) {
		t.Fatal("a branch of the newest incremental layer does not stack or differs")
	}
	checkAll(t, e)
}

// TestBranchBuildsAQueuedFreeze: a branch of a checkpoint whose freeze is
// queued (behind the sandbox's earlier one, which holds a background slot,
// the test taking any others) does not wait for a slot: once the earlier freeze is done it
// builds the layer itself, from the earlier layer, and stacks on it.
func TestBranchBuildsAQueuedFreeze(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	write(t, filepath.Join(cr.Root, "one"), "one\n")
	started, release := holdFreeze(t, e)
	_, err = e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	waitHeld(t, started)                               // the first freeze holds one slot ...
	releaseSlots := overlayOf(e).Keeper().TakeSlots(1) // ... and these the others: no background freeze can start
	write(t, filepath.Join(cr.Root, "two"), "two\n")
	c2, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	want := mergedState(t, cr.Root)
	done := make(chan error, 1)
	var root string
	// Read before the branch starts: a branch that reached the wait first
	// would otherwise be counted in it, and the loop below wait for a
	// second one that never comes.
	waited := overlayOf(e).Keeper().Waited()
	go func() {
		r, err := e.Branch(ctx, mustRef(c2.ID.String()), "b", BranchOptions{})
		if err == nil {
			root = r.Root
		}
		done <- err
	}()
	for deadline := time.Now().Add(30 * time.Second); overlayOf(e).Keeper().Waited() == waited; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the branch never found the freeze pending")
		}
	}
	release()
	must(t, <-done) // with both slots still taken: the branch built the layer
	cp2, err := e.resolveFor(ctx, "", mustRef(c2.ID.String()))
	must(t, err)
	if got := overlay.FrozenUser(e.home.sandboxDir("b")); got != overlayOf(e).Layers().Dir(cp2.FSTree) {
		t.Fatalf("the branch stacks on %q", got)
	}
	if mergedState(t, root) != want {
		t.Fatal("the branch differs from its checkpoint")
	}
	releaseSlots()
	e.WaitFreezes()
	checkAll(t, e)
}

// TestFreezePausesForTurns: a background freeze that is running stops
// between entries while a checkpoint is in flight and finishes once it
// ends; a branch that needs the layer meanwhile is not held up by the
// pause (its rush lifts it) and stacks on the layer.
func TestFreezePausesForTurns(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	layerTurn(t, cr.Root)
	started, release := holdFreeze(t, e)
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	waitHeld(t, started) // running: past its wait for idle
	cp1, err := e.resolveFor(ctx, "", mustRef(c1.ID.String()))
	must(t, err)
	ob := overlayOf(e)
	turnDone := overlayOf(e).TurnStarted() // a turn arrives mid-freeze
	paused := overlayOf(e).Keeper().Paused()
	release()
	for deadline := time.Now().Add(30 * time.Second); overlayOf(e).Keeper().Paused() == paused; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the freeze never paused for the turn in flight")
		}
	}
	if ob.Layers().Has(cp1.FSTree) {
		t.Fatal("the layer was published while its freeze paused")
	}
	turnDone()
	e.WaitFreezes()
	if !ob.Layers().Has(cp1.FSTree) {
		t.Fatal("the paused freeze never finished once the turn ended")
	}
	if _, err := ob.VerifyFrozen(ctx, cp1.FSTree); err != nil {
		t.Fatal(err)
	}

	// With a turn in flight from here on, a branch of the next checkpoint
	// rushes its freeze, which then does not pause.
	turnDone = overlayOf(e).TurnStarted()
	defer turnDone()
	write(t, filepath.Join(cr.Root, "src", "second.txt"), "second turn\n")
	c2, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	cp2, err := e.resolveFor(ctx, "", mustRef(c2.ID.String()))
	must(t, err)
	want := mergedState(t, cr.Root)
	res, err := e.Branch(ctx, mustRef(c2.ID.String()), "b", BranchOptions{})
	must(t, err)
	if got := overlay.FrozenUser(e.home.sandboxDir("b")); got != ob.Layers().Dir(cp2.FSTree) {
		t.Fatalf("the branch stacks on %q, want the checkpoint's layer", got)
	}
	if got := mergedState(t, res.Root); got != want {
		t.Fatalf("branch hashes to %s, want %s", got.Short(), want.Short())
	}
	checkAll(t, e)
}

// TestFrozenKeepSetFollowsHeads: retention's keep set, answered from its
// memo of lines by head, equals the set computed from the catalog afresh
// after each kind of head move: checkpoints, a branch, a rollback (the head
// goes back to a line the memo knows), a removed sandbox.
func TestFrozenKeepSetFollowsHeads(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	fresh := func() map[delta.ID]bool {
		keep := map[delta.ID]bool{}
		must(t, e.view(ctx, func(tx *catalog.Tx) error {
			sbs, err := tx.Sandboxes()
			if err != nil {
				return err
			}
			for _, sb := range sbs {
				head, err := tx.GetRef(delta.RefHead, string(sb.Name))
				if err != nil {
					continue
				}
				line, err := tx.Ancestors(head, frozen.DefaultKeep)
				if err != nil {
					return err
				}
				for _, cp := range line {
					keep[cp.FSTree] = true
				}
			}
			return nil
		}))
		return keep
	}
	check := func(step string) {
		t.Helper()
		for range 2 { // cold, then from the memo
			got, err := overlayOf(e).Keeper().KeepSet(ctx)
			must(t, err)
			if want := fresh(); !maps.Equal(got, want) || len(want) == 0 {
				t.Fatalf("%s: keep set %v, want %v", step, got, want)
			}
		}
	}
	base := t.TempDir()
	write(t, filepath.Join(base, "a"), "base\n")
	var ids []delta.ID
	for _, name := range []string{"s", "t"} {
		cr, err := e.CreateSandbox(ctx, delta.SandboxName(name), CreateOptions{Base: base})
		must(t, err)
		for i := range 3 {
			write(t, filepath.Join(cr.Root, "f"), fmt.Sprintf("%s turn %d\n", name, i))
			c, err := e.Checkpoint(ctx, delta.SandboxName(name), CheckpointOptions{})
			must(t, err)
			ids = append(ids, c.ID)
			check(fmt.Sprintf("%s checkpoint %d", name, i))
		}
	}
	_, err := e.Branch(ctx, mustRef(ids[1].String()), "b", BranchOptions{})
	must(t, err)
	check("branch")
	_, err = e.Rollback(ctx, "s", mustRef(ids[0].String()), RollbackOptions{})
	must(t, err)
	check("rollback")
	must(t, e.RemoveSandbox(ctx, "t"))
	check("removal")
	e.WaitFreezes()
	checkAll(t, e)
}

// TestFreezeOnBranch: with Options.FreezeOnBranch (the CLI's direct mode)
// a checkpoint with no layer to make its own from queues no freeze; the
// first branches of it (made after the sandbox changed the checkpoint's
// files, so those come from the store) build one layer, which hashes to
// the checkpoint's tree, and all stack on it; the next checkpoints of the
// sandbox and of a branch then keep layers again.
func TestFreezeOnBranch(t *testing.T) {
	ctx := context.Background()
	e, cr, c1, want := directModeCheckpoint(t)
	cp1, err := e.resolveFor(ctx, "", mustRef(c1.ID.String()))
	must(t, err)
	ob := overlayOf(e)
	pending := overlayOf(e).Keeper().Pending()
	if pending != 0 || ob.Layers().Has(cp1.FSTree) {
		t.Fatalf("the checkpoint queued %d freezes, layer kept: %v", pending, ob.Layers().Has(cp1.FSTree))
	}
	write(t, filepath.Join(cr.Root, "src", "main.go"), "changed after the checkpoint\n")
	res, err := e.BranchMany(ctx, mustRef(c1.ID.String()), sandboxNames([]string{"b1", "b2", "b3"}), BranchOptions{})
	must(t, err)
	trees, err := ob.Layers().Trees()
	must(t, err)
	if len(trees) != 1 || trees[0] != cp1.FSTree {
		t.Fatalf("frozen layers %v, want the checkpoint's alone", trees)
	}
	if _, err := ob.VerifyFrozen(ctx, cp1.FSTree); err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		name := []string{"b1", "b2", "b3"}[i]
		if got := overlay.FrozenUser(e.home.sandboxDir(delta.SandboxName(name))); got != ob.Layers().Dir(cp1.FSTree) {
			t.Fatalf("%s stacks on %q", name, got)
		}
		if got := mergedState(t, r.Root); got != want {
			t.Fatalf("%s hashes to %s, want %s", name, got.Short(), want.Short())
		}
	}
	// From here on the sandbox and its branches keep layers, each made
	// from the one before (the head's, or the one a branch stacks on).
	for _, name := range []string{"s", "b1"} {
		root := cr.Root
		if name == "b1" {
			root = res[0].Root
		}
		write(t, filepath.Join(root, "next-"+name), "next turn\n")
		c, err := e.Checkpoint(ctx, delta.SandboxName(name), CheckpointOptions{})
		must(t, err)
		e.WaitFreezes()
		cp, err := e.resolveFor(ctx, "", mustRef(c.ID.String()))
		must(t, err)
		if !ob.Layers().Has(cp.FSTree) {
			t.Fatalf("%s: the checkpoint after a branch kept no layer", name)
		}
	}
	checkAll(t, e)
}

// TestConcurrentBranchesBuildOneLayer: two branches of a checkpoint with
// no layer, made at once, build it once: the second waits for the first's
// build (held at its start) and both stack on the one layer.
func TestConcurrentBranchesBuildOneLayer(t *testing.T) {
	ctx := context.Background()
	e, _, c1, want := directModeCheckpoint(t)
	var builds atomic.Int64
	started, release := make(chan struct{}), make(chan struct{})
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock) // a failed test must not leave the build held (Close waits for it)
	e.opts.AtPhase = func(p string) {
		if p == frozen.PhaseStart && builds.Add(1) == 1 {
			close(started)
			<-release
		}
	}
	done := make(chan error, 2)
	branch := func(name string) {
		_, err := e.Branch(ctx, mustRef(c1.ID.String()), delta.SandboxName(name), BranchOptions{})
		done <- err
	}
	go branch("b1")
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("the first branch ended before building its layer: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the first branch never built its layer")
	}
	waited := overlayOf(e).Keeper().Waited()
	go branch("b2")
	for deadline := time.Now().Add(30 * time.Second); overlayOf(e).Keeper().Waited() == waited; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the second branch never found the first's build")
		}
	}
	unblock()
	must(t, <-done)
	must(t, <-done)
	if n := builds.Load(); n != 1 {
		t.Fatalf("%d builds of one layer", n)
	}
	cp1, err := e.resolveFor(ctx, "", mustRef(c1.ID.String()))
	must(t, err)
	for _, name := range []string{"b1", "b2"} {
		if got := overlay.FrozenUser(e.home.sandboxDir(delta.SandboxName(name))); got != overlayOf(e).Layers().Dir(cp1.FSTree) {
			t.Fatalf("%s stacks on %q", name, got)
		}
		root, err := e.SandboxPath(ctx, delta.SandboxName(name))
		must(t, err)
		if got := mergedState(t, root); got != want {
			t.Fatalf("%s hashes to %s, want %s", name, got.Short(), want.Short())
		}
	}
	checkAll(t, e)
}

// TestBranchBuildKeepsRoom: a branch that must write its checkpoint's
// tree into the home (a layer built for it, or a copy) first checks room
// for the whole tree plus the catalog's reserve, not for what the
// checkpoint read (a small turn on a big layer), as a rollback does: on a
// home with the reserve and less than the tree to spare, nothing is
// written and the branch fails as "full"; once space is freed the branch
// builds the layer and stacks on it.
func TestBranchBuildKeepsRoom(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=160m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	e := openEngine(t, filepath.Join(dir, "home"))
	overlayOf(e).Keeper().SetOnBranch(true)
	base := t.TempDir()
	write(t, filepath.Join(base, "a"), "base\n")
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: base})
	must(t, err)
	big := make([]byte, 24<<20)
	rand.Read(big)
	must(t, os.WriteFile(filepath.Join(cr.Root, "big"), big, 0o644))
	_, err = e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	// A file changed moments before a scan is read again by the next one
	// (delta's racy rule): this skip does, and caches it for good.
	_, err = e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	write(t, filepath.Join(cr.Root, "small"), "a small turn\n")
	c2, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	if c2.Stats.BytesRead >= 1<<20 {
		t.Fatalf("the small turn read %d bytes", c2.Stats.BytesRead)
	}
	cp2, err := e.resolveFor(ctx, "", mustRef(c2.ID.String()))
	must(t, err)
	// Leave the catalog's reserve and 12 MiB: room for the turn, not for
	// the layer.
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	must(t, err)
	chunk := make([]byte, 1<<20)
	for {
		var fs unix.Statfs_t
		must(t, unix.Statfs(dir, &fs))
		if room.AvailBytes(&fs) <= e.cat.Reserve()+12<<20 {
			break
		}
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	_, err = e.Branch(ctx, mustRef(c2.ID.String()), "b", BranchOptions{})
	if !errors.Is(err, errdefs.ErrNoSpace) {
		t.Fatalf("branch on a nearly full home: %v, want no space", err)
	}
	ob := overlayOf(e)
	if ob.Layers().Has(cp2.FSTree) {
		t.Fatal("a layer was built into the catalog's reserve")
	}
	if _, err := os.Stat(e.home.sandboxDir("b")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused branch left its directory: %v", err)
	}
	must(t, os.Remove(filler))
	r, err := e.Branch(ctx, mustRef(c2.ID.String()), "b", BranchOptions{})
	must(t, err)
	if got := overlay.FrozenUser(e.home.sandboxDir("b")); got != ob.Layers().Dir(cp2.FSTree) {
		t.Fatalf("the branch once space was freed stacks on %q", got)
	}
	if got, want := mergedState(t, r.Root), mergedState(t, cr.Root); got != want {
		t.Fatalf("branch hashes to %s, want %s", got.Short(), want.Short())
	}
	checkAll(t, e)
}

// directModeCheckpoint opens an engine as the CLI's direct mode does
// (FreezeOnBranch) with sandbox "s" on the rich base, checkpoints one
// layer turn (which queues no freeze) and returns the checkpoint with the
// merged state it holds.
func directModeCheckpoint(t *testing.T) (*Engine, *CreateResult, *CheckpointResult, delta.ID) {
	t.Helper()
	ctx := context.Background()
	e := newEngine(t)
	overlayOf(e).Keeper().SetOnBranch(true)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	layerTurn(t, cr.Root)
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	return e, cr, c1, mergedState(t, cr.Root)
}

// TestCloseCancelsBackgroundFreeze: Close during a background freeze (held
// at its start) cancels the freeze and waits for it: Close returns once
// it has stopped, its layer is not published and nothing half-built is
// left; the home opens again, and a branch then builds the layer itself.
func TestCloseCancelsBackgroundFreeze(t *testing.T) {
	ctx := context.Background()
	home := filepath.Join(t.TempDir(), "home")
	e := openEngine(t, home)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	layerTurn(t, cr.Root)
	started, release := holdFreeze(t, e)
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	waitHeld(t, started)
	cp1, err := e.resolveFor(ctx, "", mustRef(c1.ID.String()))
	must(t, err)
	want := mergedState(t, cr.Root)
	layers := overlayOf(e).Layers()
	closed := make(chan error, 1)
	go func() { closed <- e.Close() }()
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while its freeze ran", err)
	default:
	}
	release()
	select {
	case err := <-closed:
		must(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return once its freeze was cancelled")
	}
	if layers.Has(cp1.FSTree) {
		t.Fatal("a freeze cancelled by Close published its layer")
	}
	if left, _ := filepath.Glob(filepath.Join(home, "bases", ".frozen", ".tmp-*")); len(left) != 0 {
		t.Fatalf("a freeze cancelled by Close left %v", left)
	}
	e2 := openEngine(t, home)
	br, err := e2.Branch(ctx, mustRef(c1.ID.String()), "b", BranchOptions{})
	must(t, err)
	if got := overlay.FrozenUser(e2.home.sandboxDir("b")); got != overlayOf(e2).Layers().Dir(cp1.FSTree) {
		t.Fatalf("the branch after the reopen stacks on %q, want the layer it built", got)
	}
	if got := mergedState(t, br.Root); got != want {
		t.Fatalf("branch hashes to %s, want %s", got.Short(), want.Short())
	}
	checkAll(t, e2)
}
