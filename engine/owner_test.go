package engine

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/retention"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// These tests need root, overlayfs and a real MinIO (conditional writes).

// bucketHead reads a sandbox's head in the bucket with its owner line.
func bucketHead(t *testing.T, e *Engine, key string) (delta.ID, delta.Owner) {
	t.Helper()
	data, err := upload.ReadAllMax(context.Background(), e.stores.remote, delta.HeadObject(delta.SandboxKey(key)), delta.MaxSmallObject)
	must(t, err)
	id, o, err := delta.ParseHead(data)
	must(t, err)
	return id, o
}

// labelOf finds the label a home gives the sandbox with key.
func labelOf(t *testing.T, e *Engine, key string) string {
	t.Helper()
	sbs, err := e.ListSandboxes(context.Background())
	must(t, err)
	for _, s := range sbs {
		if string(s.Sandbox.Key()) == key {
			return string(s.Sandbox.Name)
		}
	}
	t.Fatalf("home %s has no sandbox %s", e.Home(), key)
	return ""
}

// Issue 23, item 2: a home that rebuilt from another home's bucket could
// roll back and checkpoint that home's overlay sandbox, both pushed, and a
// third home saw one head win and the other's work dangle. Now only the
// owner writes: the other home is refused until it adopts, an adoption
// fences the old owner, whose next push of the head is refused by the
// bucket, and a third home sees exactly the adopter's line.
func TestTwoHomesNeverCoOwnASandbox(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	cfg := remoteCfg(srv.Endpoint, "owners")
	a, b := newEngine(t), newEngine(t)
	for _, e := range []*Engine{a, b} {
		_, err := e.HomeSetup().Init(ctx, cfg)
		must(t, err)
	}
	cr, err := a.CreateSandbox(ctx, "x", CreateOptions{Base: richBase(t)})
	must(t, err)
	first := cr.Checkpoint
	write(t, filepath.Join(cr.Root, "a1"), "a's first turn")
	c1, err := a.Checkpoint(ctx, "x", CheckpointOptions{})
	must(t, err)
	_, err = a.Remote().Push(ctx, PushOptions{})
	must(t, err)
	key := cr.Sandbox.Key()
	if id, o := bucketHead(t, a, string(key)); id != c1.ID || o != (delta.Owner{Home: a.config.HomeID, Epoch: 1}) {
		t.Fatalf("bucket head after a's push: %s %v; want %s owned by a at epoch 1", id.Short(), o, c1.ID.Short())
	}

	_, err = b.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	x := labelOf(t, b, string(key))
	if _, err := b.Rollback(ctx, delta.SandboxName(x), mustRef(first.ID.String()), RollbackOptions{}); !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), "adopt") {
		t.Fatalf("b's rollback of a's sandbox: %v; want a refusal naming adopt", err)
	}
	if _, err := b.Checkpoint(ctx, delta.SandboxName(x), CheckpointOptions{}); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("b's checkpoint of a's sandbox: %v; want ErrPrecondition", err)
	}

	rep, err := b.Remote().Adopt(ctx, delta.SandboxName(x), AdoptOptions{})
	must(t, err)
	if rep.Owner != (delta.Owner{Home: b.config.HomeID, Epoch: 2}) || rep.Head != c1.ID {
		t.Fatalf("adopt: owner %v head %s; want b at epoch 2 from %s", rep.Owner, rep.Head.Short(), c1.ID.Short())
	}
	root, err := b.SandboxPath(ctx, delta.SandboxName(x))
	must(t, err)
	write(t, filepath.Join(root, "b1"), "b's turn")
	cb, err := b.Checkpoint(ctx, delta.SandboxName(x), CheckpointOptions{})
	must(t, err)
	_, err = b.Remote().Push(ctx, PushOptions{})
	must(t, err)

	// A does not know yet, but its retention reads the bucket's heads: the
	// sandbox is b's now, and a prunes none of it.
	pr, err := a.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 1})
	must(t, err)
	if len(pr.Deleted) != 0 || len(pr.Marked) != 0 {
		t.Fatalf("a pruned a sandbox b adopted: deleted %v, marked %v", pr.Deleted, pr.Marked)
	}
	// A does not know yet: its turn commits locally, its push is fenced.
	write(t, filepath.Join(cr.Root, "a2"), "a's turn after the adoption")
	ca, err := a.Checkpoint(ctx, "x", CheckpointOptions{})
	must(t, err)
	_, err = a.Remote().Push(ctx, PushOptions{})
	if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), "sandbox x") || !strings.Contains(err.Error(), b.config.HomeID) {
		t.Fatalf("a's push after b adopted: %v; want a fence naming sandbox x and b's home", err)
	}
	if id, o := bucketHead(t, a, string(key)); id != cb.ID || o.Home != b.config.HomeID || o.Epoch != 2 {
		t.Fatalf("bucket head after a's fenced push: %s %v; want b's %s", id.Short(), o, cb.ID.Short())
	}
	// Its record went up, but the turn was never accepted: it is not
	// remotely durable, now or later.
	if pending, err := a.Remote().PendingCheckpoints(ctx); err != nil || !pending[ca.ID] {
		t.Fatalf("a's fenced checkpoint %s is reported remotely durable (pending %v, %v)", ca.ID.Short(), pending, err)
	}
	// Fenced: a refuses the sandbox's turns from now on, and its next push
	// is not blocked by the head it could not write.
	if _, err := a.Checkpoint(ctx, "x", CheckpointOptions{}); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("a's checkpoint once fenced: %v; want ErrPrecondition", err)
	}
	_, err = a.Remote().Push(ctx, PushOptions{})
	must(t, err)
	if pending, _ := a.Remote().PendingCheckpoints(ctx); !pending[ca.ID] {
		t.Fatalf("a's fenced checkpoint %s became remotely durable with a later push", ca.ID.Short())
	}
	// A keeps its unpushed turn by branching it.
	_, err = a.Branch(ctx, mustRef(ca.ID.String()), "x-kept", BranchOptions{})
	must(t, err)
	_, err = a.Remote().Push(ctx, PushOptions{})
	must(t, err)

	// A third home sees b's line as x's head.
	c := newEngine(t)
	_, err = c.HomeSetup().Init(ctx, cfg)
	must(t, err)
	_, err = c.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	sbs, err := c.ListSandboxes(ctx)
	must(t, err)
	for _, s := range sbs {
		if s.Sandbox.Key() == key && s.Head.ID != cb.ID {
			t.Fatalf("third home: x's head is %s, want b's %s", s.Head.ID.Short(), cb.ID.Short())
		}
	}
	if _, err := c.Verifier().Verify(ctx, mustRef(cb.ID.String())); err != nil {
		t.Fatalf("third home: verify b's head: %v", err)
	}
}

// An owner whose daemon renews its host lease is not adopted without
// force; with force it is, and then fenced.
func TestAdoptRespectsALiveLease(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	cfg := remoteCfg(srv.Endpoint, "lease")
	a, b := newEngine(t), newEngine(t)
	for _, e := range []*Engine{a, b} {
		_, err := e.HomeSetup().Init(ctx, cfg)
		must(t, err)
	}
	cr, err := a.CreateSandbox(ctx, "y", CreateOptions{Base: richBase(t)})
	must(t, err)
	_, err = a.Remote().Push(ctx, PushOptions{})
	must(t, err)
	must(t, a.Remote().RenewLease(ctx, time.Minute))
	_, err = b.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	y := labelOf(t, b, string(cr.Sandbox.Key()))
	_, err = b.Remote().Adopt(ctx, delta.SandboxName(y), AdoptOptions{})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("adopt while the owner's lease is live: %v; want ErrUnavailable naming --force", err)
	}
	rep, err := b.Remote().Adopt(ctx, delta.SandboxName(y), AdoptOptions{Force: true})
	must(t, err)
	if rep.Lease == nil || !rep.Lease.Live || rep.Owner.Epoch != 2 {
		t.Fatalf("forced adopt: lease %+v owner %v", rep.Lease, rep.Owner)
	}
	// A lease released (a clean shutdown) protects nothing.
	must(t, a.Remote().ReleaseLease(ctx))
	if lv, err := b.Remote().HostLease(ctx, a.config.HomeID); err != nil || lv != nil {
		t.Fatalf("released lease still read: %+v %v", lv, err)
	}
}

// Homes adopting one sandbox at once: every successful adoption has its
// own epoch, the bucket ends with the highest, and every home but that
// one is fenced at its next push.
func TestConcurrentAdoptionsHaveOneWinnerPerEpoch(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	cfg := remoteCfg(srv.Endpoint, "race")
	a := newEngine(t)
	_, err := a.HomeSetup().Init(ctx, cfg)
	must(t, err)
	cr, err := a.CreateSandbox(ctx, "z", CreateOptions{Base: richBase(t)})
	must(t, err)
	_, err = a.Remote().Push(ctx, PushOptions{})
	must(t, err)
	key := cr.Sandbox.Key()
	const n = 3
	homes := make([]*Engine, n)
	for i := range homes {
		homes[i] = newEngine(t)
		_, err := homes[i].HomeSetup().Init(ctx, cfg)
		must(t, err)
		_, err = homes[i].Rebuilder().RebuildCatalog(ctx)
		must(t, err)
	}
	reps := make([]*AdoptReport, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, h := range homes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reps[i], errs[i] = h.Remote().Adopt(ctx, delta.SandboxName(labelOf(t, h, string(key))), AdoptOptions{})
		}()
	}
	wg.Wait()
	epochs := map[uint64]string{}
	var top *Engine
	var topEpoch uint64
	for i, r := range reps {
		if errs[i] != nil {
			if !errors.Is(errs[i], upload.ErrConditionFailed) {
				t.Fatalf("home %d: adopt failed other than by losing a race: %v", i, errs[i])
			}
			continue
		}
		if prev, dup := epochs[r.Owner.Epoch]; dup {
			t.Fatalf("epoch %d accepted for two homes: %s and %s", r.Owner.Epoch, prev, r.Owner.Home)
		}
		epochs[r.Owner.Epoch] = r.Owner.Home
		if r.Owner.Epoch > topEpoch {
			top, topEpoch = homes[i], r.Owner.Epoch
		}
	}
	if top == nil {
		t.Fatal("no adoption succeeded")
	}
	if _, o := bucketHead(t, a, string(key)); o.Home != top.config.HomeID || o.Epoch != topEpoch {
		t.Fatalf("bucket owner %v, want the highest epoch's home %s at %d", o, top.config.HomeID, topEpoch)
	}
	for i, h := range homes {
		if errs[i] != nil {
			continue
		}
		z := labelOf(t, h, string(key))
		root, err := h.SandboxPath(ctx, delta.SandboxName(z))
		must(t, err)
		write(t, filepath.Join(root, "turn"), h.config.HomeID)
		if _, err := h.Checkpoint(ctx, delta.SandboxName(z), CheckpointOptions{}); err != nil {
			t.Fatalf("home %d: checkpoint after adopting: %v", i, err)
		}
		_, err = h.Remote().Push(ctx, PushOptions{})
		if h == top && err != nil {
			t.Fatalf("the last adopter's push: %v", err)
		}
		if h != top && !errors.Is(err, errdefs.ErrPrecondition) {
			t.Fatalf("home %d adopted at epoch %d and was overtaken; its push: %v, want fenced", i, reps[i].Owner.Epoch, err)
		}
	}
}
