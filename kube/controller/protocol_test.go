package controller

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fleethost"
	"github.com/turnsnap/turnsnap/internal/miniotest"
)

// newAgents is a fleet of node agents and a bucket without an API server.
func newAgents(t testing.TB, n int) *fleet {
	f := &fleet{t: t, dir: t.TempDir(), log: slog.New(slog.DiscardHandler)}
	t.Cleanup(func() { fleethost.UnmountUnder(t, f.dir) })
	f.minio = miniotest.Start(t)
	f.bin = fleethost.TurnsnapBin(t)
	f.base = makeBase(t, f.dir)
	for i := 1; i <= n; i++ {
		f.agents = append(f.agents, f.newAgent(context.Background(), i))
	}
	return f
}

// TestNodeAgentSteps runs, on real node agents and a real bucket, the
// node-side steps the controller is built from, in the order it uses them:
// create and sync; a durable checkpoint; suspend (final checkpoint, tag,
// push, remove); resume on another node (rebuild, branch under the same
// name, receipt); failover (the owner killed; rebuild, adopt --force,
// mount on a third node); and the dead owner, restarted, fenced.
func TestNodeAgentSteps(t *testing.T) {
	ctx := context.Background()
	f := newAgents(t, 3)
	n1, n2, n3 := f.agents[0], f.agents[1], f.agents[2]
	const name = "work.steps"
	if _, err := n1.c.CreateSandbox(ctx, api.CreateRequest{Name: name, Base: f.base}); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.c.Sync(ctx, api.SyncRequest{Sandbox: name}); err != nil {
		t.Fatal(err)
	}
	sb, err := n1.c.GetSandbox(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(sb.Root, "a.txt"), "one\n")
	cp, err := n1.c.Checkpoint(ctx, name, api.CheckpointRequest{WaitRemote: true, Message: "k8s:uid one"})
	if err != nil || !cp.RemoteDurable {
		t.Fatalf("checkpoint: %+v %v", cp, err)
	}

	// Suspend on n1.
	if _, err := n1.c.SetTag(ctx, "ts-suspend-x", api.TagRequest{Checkpoint: cp.ID.String()}); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.c.Sync(ctx, api.SyncRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.c.RemoveSandbox(ctx, name, false); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.c.Sync(ctx, api.SyncRequest{}); err != nil {
		t.Fatal(err)
	}

	// Resume on n2.
	if _, err := n2.c.GetCheckpoint(ctx, cp.ID.String()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("n2 knows the checkpoint before a rebuild: %v", err)
	}
	if _, err := n2.c.RebuildCatalog(ctx, api.RebuildRequest{}); err != nil {
		t.Fatal(err)
	}
	rs, err := n2.c.Branch(ctx, cp.ID.String(), api.BranchRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].Receipt == nil || !rs[0].Receipt.OK {
		t.Fatalf("resume branch: %+v", rs)
	}
	e, err := n2.c.GetCheckpoint(ctx, cp.ID.String())
	if err != nil {
		t.Fatal(err)
	}
	if rc := rs[0].Receipt.Files; rc.Want != e.FSTree || rc.WantState != rc.GotState {
		t.Fatalf("resume receipt: want %s (state %s) got state %s; the checkpoint's tree is %s", rc.Want.Short(), rc.WantState.Short(), rc.GotState.Short(), e.FSTree.Short())
	}
	if got := readFile(t, filepath.Join(rs[0].Root, "a.txt")); got != "one\n" {
		t.Fatalf("resumed a.txt: %q", got)
	}
	if _, err := n2.c.DeleteTag(ctx, "ts-suspend-x"); err != nil {
		t.Fatalf("deleting the suspend tag on the resuming node: %v", err)
	}
	if _, err := n2.c.Sync(ctx, api.SyncRequest{Sandbox: name}); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(rs[0].Root, "b.txt"), "two\n")
	cp2, err := n2.c.Checkpoint(ctx, name, api.CheckpointRequest{WaitRemote: true})
	if err != nil || !cp2.RemoteDurable {
		t.Fatalf("checkpoint on n2: %+v %v", cp2, err)
	}

	// n2 dies; n3 adopts.
	n2.kill()
	if _, err := n3.c.RebuildCatalog(ctx, api.RebuildRequest{}); err != nil {
		t.Fatal(err)
	}
	ad, err := n3.c.AdoptSandbox(ctx, name, api.AdoptRequest{Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if ad.Head != cp2.ID.String() {
		t.Fatalf("adopted at %s, want %s", ad.Head, cp2.ID)
	}
	p, err := n3.c.SandboxPath(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(p.Root, "b.txt")); got != "two\n" {
		t.Fatalf("adopted b.txt: %q", got)
	}
	if ad2, err := n3.c.AdoptSandbox(ctx, name, api.AdoptRequest{Force: true}); err != nil || !ad2.Already {
		t.Fatalf("adopting again: %+v %v; want already", ad2, err)
	}

	// n2 comes back: fenced.
	if err := n2.start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rs[0].Root, "late.txt"), []byte("late\n"), 0o644); err != nil {
		t.Logf("writing into n2's old root: %v", err)
	}
	_, err = n2.c.Checkpoint(ctx, name, api.CheckpointRequest{WaitRemote: true})
	if !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("the dead owner's checkpoint after the adoption: %v; want precondition", err)
	}
	t.Logf("fenced: %v", err)
}
