package engine

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/btrfs"
	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/btrfstest"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"github.com/turnsnap/turnsnap/overlay"
)

// These tests need root, overlayfs and a loop-mounted btrfs (btrfstest).
// Checkpoints have one format whatever backend took them, so a checkpoint
// restores into a sandbox of either backend with an identical merged tree.

func btrfsOpts(pool, base string) CreateOptions {
	return CreateOptions{Base: base, Backend: btrfs.Name, Btrfs: btrfs.Options{Pool: pool}}
}

func TestBtrfsCheckpointRestoresIntoOverlay(t *testing.T) {
	ctx := context.Background()
	pool := btrfstest.Pool(t)
	e := newEngine(t)
	base := roottest.RichBase(t)
	cr, err := e.CreateSandbox(ctx, "b", btrfsOpts(pool, base))
	must(t, err)
	roottest.AgentTurn(t, cr.Root)
	want := mergedState(t, cr.Root)
	c1, err := e.Checkpoint(ctx, "b", CheckpointOptions{})
	must(t, err)
	if c1.Class != delta.ClassFS {
		t.Fatalf("turn with edits classed %s", c1.Class)
	}
	// Branch into overlay: a btrfs checkpoint on a host without btrfs.
	br, err := e.Branch(ctx, mustRef(c1.ID.String()), "o", BranchOptions{Backend: overlay.Name})
	must(t, err)
	if got := mergedState(t, br.Root); got != want {
		t.Fatalf("overlay branch of a btrfs checkpoint hashes to %s, want %s", got.Short(), want.Short())
	}
	settle()
	noop, err := e.Checkpoint(ctx, "o", CheckpointOptions{})
	must(t, err)
	if noop.Class != delta.ClassSkip {
		t.Fatalf("first turn of the overlay branch, unchanged, classed %s", noop.Class)
	}
	// Rollback of an overlay sandbox on the same base to the btrfs checkpoint.
	_, err = e.CreateSandbox(ctx, "o2", CreateOptions{Base: base})
	must(t, err)
	rb, err := e.Rollback(ctx, "o2", mustRef(c1.ID.String()), RollbackOptions{})
	must(t, err)
	if got := mergedState(t, rb.Root); got != want {
		t.Fatalf("overlay rollback to a btrfs checkpoint hashes to %s, want %s", got.Short(), want.Short())
	}
	// And the overlay branch's own checkpoint back into btrfs.
	write(t, filepath.Join(br.Root, "from-overlay"), "o")
	want2 := mergedState(t, br.Root)
	c2, err := e.Checkpoint(ctx, "o", CheckpointOptions{})
	must(t, err)
	back, err := e.Branch(ctx, mustRef(c2.ID.String()), "b2", BranchOptions{Backend: btrfs.Name, Btrfs: btrfs.Options{Pool: pool}})
	must(t, err)
	if got := mergedState(t, back.Root); got != want2 {
		t.Fatalf("btrfs branch of the overlay checkpoint hashes to %s, want %s", got.Short(), want2.Short())
	}
}

func TestOverlayCheckpointRestoresIntoBtrfs(t *testing.T) {
	ctx := context.Background()
	pool := btrfstest.Pool(t)
	e := newEngine(t)
	base := roottest.RichBase(t)
	cr, err := e.CreateSandbox(ctx, "o", CreateOptions{Base: base})
	must(t, err)
	roottest.AgentTurn(t, cr.Root)
	want := mergedState(t, cr.Root)
	c1, err := e.Checkpoint(ctx, "o", CheckpointOptions{})
	must(t, err)
	br, err := e.Branch(ctx, mustRef(c1.ID.String()), "b", BranchOptions{Backend: btrfs.Name, Btrfs: btrfs.Options{Pool: pool}})
	must(t, err)
	if got := mergedState(t, br.Root); got != want {
		t.Fatalf("btrfs branch of an overlay checkpoint hashes to %s, want %s", got.Short(), want.Short())
	}
	// Overlay broke the base hardlink when the turn moved one of its names;
	// btrfs describes the same state with the other name touched. The first
	// checkpoint may record that equivalent layer, but reads no file.
	first, err := e.Checkpoint(ctx, "b", CheckpointOptions{})
	must(t, err)
	if first.Stats.FilesRead != 0 {
		t.Fatalf("first turn of the btrfs branch read %d files", first.Stats.FilesRead)
	}
	noop, err := e.Checkpoint(ctx, "b", CheckpointOptions{})
	must(t, err)
	if noop.Class != delta.ClassSkip {
		t.Fatalf("unchanged turn of the btrfs branch classed %s", noop.Class)
	}
	// A sandbox of the other backend on the same base rolls back to it.
	_, err = e.CreateSandbox(ctx, "b2", btrfsOpts(pool, base))
	must(t, err)
	rb, err := e.Rollback(ctx, "b2", mustRef(c1.ID.String()), RollbackOptions{})
	must(t, err)
	if got := mergedState(t, rb.Root); got != want {
		t.Fatalf("btrfs rollback to an overlay checkpoint hashes to %s, want %s", got.Short(), want.Short())
	}
}

// TestBtrfsSandboxLifecycle drives a btrfs sandbox through the engine:
// skip turns, local rollback and branch from restore points, rollback from
// the store once the restore points are pruned, and removal.
func TestBtrfsSandboxLifecycle(t *testing.T) {
	ctx := context.Background()
	pool := btrfstest.Pool(t)
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", btrfsOpts(pool, richBase(t)))
	must(t, err)
	if poolOf(cr.Sandbox.Config) != pool {
		t.Fatalf("sandbox config %v does not keep the pool", cr.Sandbox.Config)
	}
	h0 := mergedState(t, cr.Root)
	agentTurn(t, cr.Root)
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	h1 := mergedState(t, cr.Root)
	objects := countObjects(t, e.Store())
	for i := range 3 {
		r, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
		must(t, err)
		if r.Class != delta.ClassSkip || r.Stats.BytesNew != 0 || r.Stats.FilesRead != 0 {
			t.Fatalf("unchanged turn %d: class %s, %d bytes new, %d files read", i, r.Class, r.Stats.BytesNew, r.Stats.FilesRead)
		}
	}
	if n := countObjects(t, e.Store()); n != objects {
		t.Fatalf("skip turns wrote %d store objects", n-objects)
	}
	must(t, os.RemoveAll(filepath.Join(cr.Root, "src")))
	c2, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	h2 := mergedState(t, cr.Root)

	// Local rollback (restore point), branch (another sandbox's point).
	if _, err := e.Rollback(ctx, "s", mustRef(c1.ID.String()), RollbackOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := mergedState(t, cr.Root); got != h1 {
		t.Fatalf("rollback gives %s, want %s", got.Short(), h1.Short())
	}
	br, err := e.Branch(ctx, mustRef(c2.ID.String()), "b", BranchOptions{})
	must(t, err)
	if got := mergedState(t, br.Root); got != h2 {
		t.Fatalf("branch gives %s, want %s", got.Short(), h2.Short())
	}
	sb := e.mustSandbox(t, "b")
	if sb.Backend != btrfs.Name || poolOf(sb.Config) != pool {
		t.Fatalf("branch inherits backend %s config %v", sb.Backend, sb.Config)
	}

	// With the restore points gone, rollback materialises from the store.
	for _, name := range []string{"s", "b"} {
		st, err := e.loadSandbox(ctx, delta.SandboxName(name))
		must(t, err)
		must(t, st.root.(*btrfs.Root).PruneRestorePoints(ctx, 0))
	}
	if _, err := e.Rollback(ctx, "s", mustRef(c2.ID.String()), RollbackOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := mergedState(t, cr.Root); got != h2 {
		t.Fatalf("rollback from the store gives %s, want %s", got.Short(), h2.Short())
	}
	if _, err := e.Rollback(ctx, "s", mustRef(c1.ID.String()), RollbackOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := mergedState(t, cr.Root); got != h1 {
		t.Fatalf("second rollback from the store gives %s, want %s", got.Short(), h1.Short())
	}
	r, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	if r.Class != delta.ClassSkip || r.Stats.FilesRead != 0 {
		t.Fatalf("turn after rollback from the store: class %s, %d files read", r.Class, r.Stats.FilesRead)
	}
	log, err := e.History().Log(ctx, "s")
	must(t, err)
	if _, err := e.Rollback(ctx, "s", mustRef(log[len(log)-1].ID.String()), RollbackOptions{}); err != nil { // turn 0: the base
		t.Fatal(err)
	}
	if got := mergedState(t, cr.Root); got != h0 {
		t.Fatalf("rollback to turn 0 gives %s, want the base %s", got.Short(), h0.Short())
	}

	for _, name := range []string{"s", "b"} {
		must(t, e.RemoveSandbox(ctx, delta.SandboxName(name)))
	}
	left, _ := os.ReadDir(filepath.Join(pool, "sandboxes"))
	if len(left) != 0 {
		t.Fatalf("removing the sandboxes left %d entries in the pool", len(left))
	}
}

func (e *Engine) mustSandbox(t *testing.T, name string) *delta.Sandbox {
	t.Helper()
	var sb *delta.Sandbox
	must(t, e.view(context.Background(), func(tx *catalog.Tx) error {
		var err error
		sb, err = tx.Sandbox(delta.SandboxName(name))
		return err
	}))
	return sb
}

// poolOf returns the btrfs pool a sandbox's stored options name.
func poolOf(cfg json.RawMessage) string {
	var o btrfs.Options
	if json.Unmarshal(cfg, &o) != nil {
		return ""
	}
	return o.Pool
}
