package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
)

// TestConcurrentOperations drives one Engine from 8 goroutines at once, each
// on its own sandboxes (real overlay mounts): checkpoints, rollbacks,
// branches and verifies, over 200 operations in all. Every goroutine also
// writes content identical to the others' at the same turn (files and a
// whole directory), so concurrent checkpoints find the same chunks and trees
// new at once. Each rollback and branch must give the exact tree its
// checkpoint recorded; at the end the checker must pass and the catalog's
// refcounts must equal a recount (what a rebuild makes). Run it under -race.
func TestConcurrentOperations(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	base := richBase(t)
	const workers, turns = 8, 10 // 8 × (create + 10 × (checkpoint, verify) + 3 rollbacks + 3 branches) = 216 ops
	var ops atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := stressWorker(ctx, e, base, w, turns, &ops); err != nil {
				errs <- fmt.Errorf("worker %d: %w", w, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	if n := ops.Load(); n < 200 {
		t.Fatalf("%d operations, want at least 200", n)
	}
	t.Logf("%d operations; %d blobs stored twice by racing operations (left for gc)", ops.Load(), e.data.repo.Duplicates())
	checkAll(t, e)
}

// stressWorker runs one goroutine's share: its own sandbox, a turn per
// iteration, a rollback and a branch every third turn.
func stressWorker(ctx context.Context, e *Engine, base string, w, turns int, ops *atomic.Int64) error {
	name := fmt.Sprintf("w%d", w)
	cr, err := e.CreateSandbox(ctx, delta.SandboxName(name), CreateOptions{Base: base})
	if err != nil {
		return err
	}
	ops.Add(1)
	root := cr.Root
	type point struct {
		id    delta.ID
		state delta.ID
	}
	var points []point
	for i := range turns {
		files := map[string]string{
			fmt.Sprintf("own/%s-%d.txt", name, i): fmt.Sprintf("worker %d turn %d\n", w, i),
			fmt.Sprintf("shared/turn-%d.txt", i):  fmt.Sprintf("the same bytes in every sandbox at turn %d\n", i),
			fmt.Sprintf("same/%d/a", i):           "identical directory\n",
			fmt.Sprintf("same/%d/b", i):           fmt.Sprintf("identical directory, turn %d\n", i),
		}
		for p, c := range files {
			if err := writeFile(filepath.Join(root, p), c); err != nil {
				return err
			}
		}
		r, err := e.Checkpoint(ctx, delta.SandboxName(name), CheckpointOptions{})
		if err != nil {
			return fmt.Errorf("turn %d: %w", i, err)
		}
		ops.Add(1)
		state, err := scanRoot(ctx, root)
		if err != nil {
			return err
		}
		points = append(points, point{r.ID, state})
		if _, err := e.Verifier().Verify(ctx, mustRef(r.ID.String())); err != nil {
			return fmt.Errorf("turn %d: %w", i, err)
		}
		ops.Add(1)
		if i%3 != 2 {
			continue
		}
		// Roll back to an earlier turn and check the tree is exactly it.
		back := points[i/2]
		if _, err := e.Rollback(ctx, delta.SandboxName(name), mustRef(back.id.String()), RollbackOptions{}); err != nil {
			return fmt.Errorf("turn %d: %w", i, err)
		}
		ops.Add(1)
		if got, err := scanRoot(ctx, root); err != nil || got != back.state {
			return fmt.Errorf("turn %d: rollback to %s gives %s, want %s (%v)", i, back.id.Short(), got.Short(), back.state.Short(), err)
		}
		br, err := e.Branch(ctx, mustRef(r.ID.String()), delta.SandboxName(fmt.Sprintf("%s-b%d", name, i)), BranchOptions{})
		if err != nil {
			return fmt.Errorf("turn %d: %w", i, err)
		}
		ops.Add(1)
		if got, err := scanRoot(ctx, br.Root); err != nil || got != points[i].state {
			return fmt.Errorf("turn %d: branch of %s gives %s, want %s (%v)", i, r.ID.Short(), got.Short(), points[i].state.Short(), err)
		}
	}
	return nil
}

func writeFile(p, content string) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, []byte(content), 0o644)
}

// scanRoot hashes what a process in the sandbox sees (mergedState without
// a testing.TB, for goroutines).
func scanRoot(ctx context.Context, root string) (delta.ID, error) {
	res, err := fstree.Scan(ctx, root, fstree.ScanOptions{})
	if err != nil {
		return delta.ID{}, err
	}
	return res.Root, nil
}

// TestCreateManySandboxesAtOnce: a platform starting 32 sandboxes from one
// base at the same moment, each taking a first turn right away. They all
// add to the base's refcounts, so their catalog transactions conflict;
// every one must still succeed (the bench saw "transaction still
// conflicting after 5 attempts" for some at 16-32), and the catalog must
// check out afterwards.
func TestCreateManySandboxesAtOnce(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	e := newEngine(t)
	if _, err := e.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "many")); err != nil {
		t.Fatal(err)
	}
	base := richBase(t)
	const n = 32
	// The daemon's pusher pushes beside the creates: its dequeues touch
	// the upload queue every commit writes to.
	pushCtx, stopPush := context.WithCancel(ctx)
	pushed := make(chan error, 1)
	go func() {
		var err error
		for pushCtx.Err() == nil && err == nil {
			_, err = e.Remote().Push(pushCtx, PushOptions{})
		}
		if pushCtx.Err() != nil {
			err = nil
		}
		pushed <- err
	}()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			name := fmt.Sprintf("s%02d", i)
			res, err := e.CreateSandbox(ctx, delta.SandboxName(name), CreateOptions{Base: base})
			if err != nil {
				errs <- err
				return
			}
			if err := os.WriteFile(filepath.Join(res.Root, "turn1.txt"), []byte(name), 0o644); err != nil {
				errs <- err
				return
			}
			if _, err := e.Checkpoint(ctx, delta.SandboxName(name), CheckpointOptions{}); err != nil {
				errs <- err
			}
		}()
	}
	close(start)
	wg.Wait()
	stopPush()
	if err := <-pushed; err != nil {
		t.Errorf("push beside the creates: %v", err)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	list, err := e.ListSandboxes(ctx)
	if err != nil || len(list) != n {
		t.Fatalf("%d sandboxes listed (%v), want %d", len(list), err, n)
	}
	checkAll(t, e)
}
