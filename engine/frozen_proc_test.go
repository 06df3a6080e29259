package engine

import (
	"context"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/overlay"
)

// Needs root, overlayfs, runc, busybox-static and CRIU (requireProcs).

// TestStackedBranchesRestoreProcesses: a fan-out of a checkpoint with a
// running counter stacks every branch on the frozen layer (made while the
// counter kept rewriting its file, so from the store where the live copy
// had moved on), and each counter continues from the cut; a checkpoint of
// a stacked branch freezes again and its own branch continues too.
func TestStackedBranchesRestoreProcesses(t *testing.T) {
	requireProcs(t)
	ctx := context.Background()
	e := newEngine(t)
	_, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: busyboxBase(t)})
	must(t, err)
	_, err = e.Processes().Exec(ctx, "s", []string{"sh", "-c", counterScript}, ExecOptions{Detach: true})
	must(t, err)
	time.Sleep(1500 * time.Millisecond)
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	atCut := counter(t, e, "s")
	rs, err := e.BranchMany(ctx, mustRef(c1.ID.String()), sandboxNames([]string{"b1", "b2"}), BranchOptions{})
	must(t, err)
	for _, r := range rs {
		if !r.Processes || overlay.FrozenUser(e.home.sandboxDir(delta.SandboxName(r.Sandbox))) == "" {
			t.Fatalf("branch %s: processes %v, stacked %q", r.Sandbox, r.Processes, overlay.FrozenUser(e.home.sandboxDir(delta.SandboxName(r.Sandbox))))
		}
	}
	time.Sleep(300 * time.Millisecond)
	for _, b := range []string{"b1", "b2"} {
		if n := counter(t, e, b); n < atCut/2 {
			t.Fatalf("stacked branch %s counter %d restarted (cut at about %d)", b, n, atCut)
		}
	}
	c2, err := e.Checkpoint(ctx, "b1", CheckpointOptions{})
	must(t, err)
	atCut2 := counter(t, e, "b1")
	bb, err := e.Branch(ctx, mustRef(c2.ID.String()), "bb", BranchOptions{})
	must(t, err)
	if !bb.Processes || overlay.FrozenUser(e.home.sandboxDir("bb")) == "" {
		t.Fatal("branch of a stacked branch: not stacked or no processes")
	}
	time.Sleep(300 * time.Millisecond)
	if n := counter(t, e, "bb"); n < atCut2/2 {
		t.Fatalf("branch of a stacked branch: counter %d restarted (cut at about %d)", n, atCut2)
	}
	n1 := counter(t, e, "b1")
	time.Sleep(300 * time.Millisecond)
	if counter(t, e, "b1") <= n1 || counter(t, e, "bb") <= atCut2/2 {
		t.Fatal("a counter stopped")
	}
}
