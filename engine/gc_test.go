package engine

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/retention"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func randomFile(t testing.TB, p string, size int) {
	t.Helper()
	b := make([]byte, size)
	rand.Read(b)
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, b, 0o644))
}

func TestPruneThenGCReclaimsOnlyDeadPacks(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	var ids []delta.ID
	for i := range 5 {
		if i > 0 {
			must(t, os.Remove(filepath.Join(cr.Root, fmt.Sprintf("blob%d", i-1))))
		}
		randomFile(t, filepath.Join(cr.Root, fmt.Sprintf("blob%d", i)), 200<<10)
		c, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
		must(t, err)
		ids = append(ids, c.ID)
	}
	_, err = e.History().Tag(ctx, "keeper", mustRef(ids[1].String()))
	must(t, err)
	before := countObjects(t, e.stores.local)
	pr, err := e.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 2})
	must(t, err)
	// Kept: the newest two and the tag; deleted: turn 0, turns 1 and 3 of
	// the five edits (ids[0], ids[2]).
	if len(pr.Deleted) != 3 {
		t.Fatalf("prune deleted %d checkpoints, want 3: %v", len(pr.Deleted), pr.Deleted)
	}
	gr, err := e.Retention().GC(ctx, retention.GCOptions{Grace: -1})
	must(t, err)
	if gr.Deleted < 2 || gr.DeletedBytes < 400<<10 {
		t.Fatalf("gc reclaimed %d packs, %d bytes: %+v", gr.Deleted, gr.DeletedBytes, gr)
	}
	if n := countObjects(t, e.stores.local); n >= before {
		t.Fatalf("store has %d objects after prune+gc, had %d", n, before)
	}
	for _, id := range []delta.ID{ids[1], ids[3], ids[4]} {
		if _, err := e.Verifier().Verify(ctx, mustRef(id.String())); err != nil {
			t.Fatalf("kept checkpoint %s after gc: %v", id.Short(), err)
		}
	}
	if _, err := e.Rollback(ctx, "s", mustRef("keeper"), RollbackOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(cr.Root, "blob1")); err != nil {
		t.Fatalf("rollback to a tagged checkpoint after gc: %v", err)
	}
	log, err := e.History().Log(ctx, "s")
	must(t, err)
	if len(log) != 3 {
		t.Fatalf("log after prune has %d entries, want 3", len(log))
	}
	// Refcounts maintained through prune equal those a rebuild recomputes.
	blobs := allBlobIDs(t, e)
	maintained := refcounts(t, e, blobs)
	_, err = e.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	if got := refcounts(t, e, blobs); fmt.Sprint(got) != fmt.Sprint(maintained) {
		t.Fatal("refcounts after prune differ from a rebuild's")
	}
	checkAll(t, e)
}

// Two homes share a bucket; each checkpoints, pushes, prunes and collects at
// random, concurrently. Whatever the interleaving, every record in the
// bucket stays complete and every kept checkpoint of each host verifies.
func TestGCWithTwoHostsNeverDeletesReferencedPacks(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	homes := []*Engine{newEngine(t), newEngine(t)}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for i, e := range homes {
		_, err := e.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "shared"))
		must(t, err)
		name := fmt.Sprintf("host%d", i)
		cr, err := e.CreateSandbox(ctx, delta.SandboxName(name), CreateOptions{Base: richBase(t)})
		must(t, err)
		wg.Add(1)
		go func(e *Engine, root string, seed int64) {
			defer wg.Done()
			errs <- hostLoop(ctx, e, name, root, seed)
		}(e, cr.Root, int64(i+1))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range homes {
		_, err := e.Remote().Push(ctx, PushOptions{})
		must(t, err)
	}
	// Whatever the random loops did (their prunes may only have marked,
	// while the other host's pushes held the bucket), a last prune on each
	// host leaves dead packs, so the gc below collects for real, not
	// vacuously.
	for _, e := range homes {
		_, err := e.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 1})
		must(t, err)
		_, err = e.Remote().Push(ctx, PushOptions{})
		must(t, err)
	}
	gr, err := homes[0].Retention().GC(ctx, retention.GCOptions{Grace: -1})
	must(t, err)
	if deleted := collected.Load() + int64(gr.Deleted); deleted == 0 {
		t.Fatal("no gc deleted any pack: the test exercised nothing")
	}
	t.Logf("gc deleted %d packs across the run", collected.Load()+int64(gr.Deleted))
	checkBucket(t, srv, "shared")
}

// collected counts packs deleted by hostLoop's gcs (shared by both hosts).
var collected atomic.Int64

// Host B still needs pack P through a checkpoint it has not uploaded, while
// every record in the bucket that referenced P is pruned; host A's gc
// collects P. B's next push must notice and put P back before the record.
// (The pruned record is off every ref in the bucket first: prune keeps what
// a ref there names, B's own pushed head included.)
func TestPushRestoresAPackAnotherHostCollected(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	a, b := newEngine(t), newEngine(t)
	for _, e := range []*Engine{a, b} {
		_, err := e.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "collected"))
		must(t, err)
	}
	cr, err := b.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	randomFile(t, filepath.Join(cr.Root, "kept-in-P"), 300<<10)
	inP, err := os.ReadFile(filepath.Join(cr.Root, "kept-in-P"))
	must(t, err)
	_, err = b.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	must(t, os.Remove(filepath.Join(cr.Root, "kept-in-P")))
	_, err = b.Checkpoint(ctx, "s", CheckpointOptions{}) // s's head in the bucket no longer names P
	must(t, err)
	_, err = b.Remote().Push(ctx, PushOptions{})
	must(t, err)
	settle()
	cr2, err := b.CreateSandbox(ctx, "s2", CreateOptions{Base: richBase(t)})
	must(t, err)
	write(t, filepath.Join(cr2.Root, "kept-in-P"), string(inP)) // the same bytes: reused from P
	c2, err := b.Checkpoint(ctx, "s2", CheckpointOptions{})
	must(t, err)
	_, err = b.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 1}) // the bucket loses every record naming P
	must(t, err)
	gr, err := a.Retention().GC(ctx, retention.GCOptions{Grace: -1})
	must(t, err)
	if gr.Deleted == 0 {
		t.Fatalf("host A's gc collected nothing: %+v", gr)
	}
	_, err = b.Remote().Push(ctx, PushOptions{})
	must(t, err)
	if !remoteRecords(t, b)[c2.ID.String()] {
		t.Fatal("record not uploaded")
	}
	checkBucket(t, srv, "collected")
}

// hostLoop runs a bounded random sequence of operations on one home,
// retrying operations that find the bucket locked by the other host.
func hostLoop(ctx context.Context, e *Engine, name, root string, seed int64) error {
	rng := mrand.New(mrand.NewSource(seed))
	retry := func(op func() error) error {
		for attempt := 0; ; attempt++ {
			err := op()
			if !errors.Is(err, errdefs.ErrUnavailable) || attempt == 50 {
				return err
			}
			time.Sleep(time.Duration(20+rng.Intn(80)) * time.Millisecond)
		}
	}
	for step := range 14 {
		switch op := rng.Intn(4); {
		case op <= 1: // a turn: new files, a rewrite, a deletion, shared content
			for range 1 + rng.Intn(3) {
				b := make([]byte, 1+rng.Intn(300<<10))
				rng.Read(b)
				if err := os.WriteFile(filepath.Join(root, fmt.Sprintf("f%d", rng.Intn(6))), b, 0o644); err != nil {
					return err
				}
			}
			shared := make([]byte, 100<<10) // same bytes on both hosts: cross-host dedup
			mrand.New(mrand.NewSource(int64(step))).Read(shared)
			if err := os.WriteFile(filepath.Join(root, "shared"), shared, 0o644); err != nil {
				return err
			}
			if _, err := e.Checkpoint(ctx, delta.SandboxName(name), CheckpointOptions{}); err != nil {
				return fmt.Errorf("%s step %d checkpoint: %w", name, step, err)
			}
			if rng.Intn(2) == 0 {
				if err := retry(func() error { _, err := e.Remote().Push(ctx, PushOptions{}); return err }); err != nil {
					return fmt.Errorf("%s step %d push: %w", name, step, err)
				}
			}
		case op == 2:
			if _, err := e.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 2}); err != nil {
				return fmt.Errorf("%s step %d prune: %w", name, step, err)
			}
		default:
			if err := retry(func() error {
				r, err := e.Retention().GC(ctx, retention.GCOptions{Grace: -1})
				if err == nil {
					collected.Add(int64(r.Deleted))
				}
				return err
			}); err != nil {
				return fmt.Errorf("%s step %d gc: %w", name, step, err)
			}
		}
	}
	// Every checkpoint this host kept still verifies against what exists.
	return e.view(ctx, func(tx *catalog.Tx) error {
		return tx.ForEachCheckpoint(func(cp *delta.Checkpoint) error {
			if _, err := e.Verifier().Verify(ctx, mustRef(cp.ID.String())); err != nil {
				return fmt.Errorf("%s: kept checkpoint %s: %w", name, cp.ID.Short(), err)
			}
			return nil
		})
	})
}
