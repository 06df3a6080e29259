package catalog

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// TestGroupSharesOneTransaction: callers that arrive while a group
// transaction waits for its lock share the next one (their fns ran in the
// same Tx), each sees the writes of those before it, and all are durable.
func TestGroupSharesOneTransaction(t *testing.T) {
	c := openTest(t)
	var hold sync.Mutex
	g := &Group{Hold: &hold}
	id := delta.Hash([]byte("counter"))
	const n = 12
	var mu sync.Mutex
	txOf := map[int]*Tx{}
	hold.Lock() // the first transaction waits here while the others queue
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		if i == 1 {
			waitQueued(g, 0) // the first call leads, alone, and waits for hold
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- g.Update(context.Background(), c, func(tx *Tx) error {
				mu.Lock()
				txOf[i] = tx
				mu.Unlock()
				_, err := tx.AddRefCount(id, 1)
				return err
			})
		}()
	}
	waitQueued(g, n-1) // all but the leader's own
	hold.Unlock()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	distinct := map[*Tx]bool{}
	for _, tx := range txOf {
		distinct[tx] = true
	}
	if len(txOf) != n || len(distinct) > 3 {
		t.Fatalf("%d calls ran in %d transactions, want at most 3", len(txOf), len(distinct))
	}
	view(t, c, func(tx *Tx) error {
		if got, err := tx.RefCount(id); err != nil || got != n {
			t.Errorf("count %d %v, want %d: a grouped call lost another's write", got, err, n)
		}
		return nil
	})
}

// waitQueued waits until g has a leader and n calls queued behind it.
func waitQueued(g *Group, n int) {
	for {
		g.mu.Lock()
		ok := g.leading && len(g.queue) == n
		g.mu.Unlock()
		if ok {
			return
		}
		runtime.Gosched()
	}
}

// TestGroupIsolatesAFailure: one caller's error fails the shared
// transaction; every call then runs alone, so the others commit and only
// the failing caller sees its error, and none of its writes is kept.
func TestGroupIsolatesAFailure(t *testing.T) {
	c := openTest(t)
	var hold sync.Mutex
	g := &Group{Hold: &hold}
	const n = 6
	bad := errors.New("this caller's own failure")
	hold.Lock()
	var wg sync.WaitGroup
	got := make([]error, n)
	for i := range n {
		if i == 1 {
			waitQueued(g, 0)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = g.Update(context.Background(), c, func(tx *Tx) error {
				if _, err := tx.AddRefCount(delta.Hash([]byte(fmt.Sprint(i))), 1); err != nil {
					return err
				}
				if i == 3 {
					return bad
				}
				return nil
			})
		}()
	}
	waitQueued(g, n-1)
	hold.Unlock()
	wg.Wait()
	view(t, c, func(tx *Tx) error {
		for i := range n {
			cnt, err := tx.RefCount(delta.Hash([]byte(fmt.Sprint(i))))
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case i == 3 && (!errors.Is(got[i], bad) || cnt != 0):
				t.Errorf("the failing call: %v, count %d", got[i], cnt)
			case i != 3 && (got[i] != nil || cnt != 1):
				t.Errorf("call %d: %v, count %d", i, got[i], cnt)
			}
		}
		return nil
	})
}

// TestGroupCanceledCallerWritesNothing: a caller whose context ends before
// its transaction runs gets the context's error and writes nothing.
func TestGroupCanceledCallerWritesNothing(t *testing.T) {
	c := openTest(t)
	var g Group
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	id := delta.Hash([]byte("never"))
	err := g.Update(ctx, c, func(tx *Tx) error {
		_, err := tx.AddRefCount(id, 1)
		return err
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled call: %v", err)
	}
	view(t, c, func(tx *Tx) error {
		if n, _ := tx.RefCount(id); n != 0 {
			t.Errorf("a canceled call wrote a count of %d", n)
		}
		return nil
	})
}

// TestRecordCacheNeverHidesTheCatalog: a record read twice comes from the
// cache as a copy its caller may change; a record deleted is not found
// though its decode is cached; and other bytes under a cached ID are
// decoded afresh, so corruption is still caught.
func TestRecordCacheNeverHidesTheCatalog(t *testing.T) {
	c := openTest(t)
	cp := testRecord("s", delta.ID{}, 1, t0)
	proc := delta.Hash([]byte("proc"))
	cp.ProcTree = &proc
	cp.Host = []byte(`{"kernel":"6.18"}`)
	update(t, c, func(tx *Tx) error { return tx.PutCheckpoint(cp) })
	read := func() (*delta.Checkpoint, error) {
		var out *delta.Checkpoint
		err := c.View(context.Background(), func(tx *Tx) error {
			var err error
			out, err = tx.Checkpoint(cp.ID)
			return err
		})
		return out, err
	}
	a, err := read()
	if err != nil {
		t.Fatal(err)
	}
	a.ProcTree[0] ^= 0xff
	a.Host[2] = 'X'
	a.Message = "changed by a caller"
	b, err := read()
	if err != nil {
		t.Fatal(err)
	}
	if *b.ProcTree != proc || string(b.Host) != `{"kernel":"6.18"}` || b.Message != cp.Message || b.ID != cp.ID {
		t.Fatalf("a caller's change reached the next reader: %+v", b)
	}
	// Other bytes under the same key (a damaged catalog): not the cached
	// decode, but the hash check's error.
	update(t, c, func(tx *Tx) error {
		return tx.set(checkpointKey(cp.ID), []byte(`{"version":2}`), "test")
	})
	if _, err := read(); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("damaged record under a cached ID: %v, want ErrCorrupt", err)
	}
	update(t, c, func(tx *Tx) error { return tx.del(checkpointKey(cp.ID), "test") })
	if _, err := read(); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("deleted record under a cached ID: %v, want ErrNotFound", err)
	}
}

// TestSnapshotSeesItsStart: a Snapshot reads the catalog as of its start
// (a count written after it is not seen, one before is), across calls,
// and refuses to read once closed.
func TestSnapshotSeesItsStart(t *testing.T) {
	c := openTest(t)
	before, after := delta.Hash([]byte("before")), delta.Hash([]byte("after"))
	update(t, c, func(tx *Tx) error { _, err := tx.AddRefCount(before, 1); return err })
	s, err := c.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	update(t, c, func(tx *Tx) error { _, err := tx.AddRefCount(after, 1); return err })
	for range 2 {
		err := s.View(context.Background(), func(tx *Tx) error {
			nb, err := tx.RefCount(before)
			if err != nil {
				return err
			}
			na, err := tx.RefCount(after)
			if err != nil {
				return err
			}
			if nb != 1 || na != 0 {
				t.Errorf("snapshot reads %d and %d, want 1 and 0", nb, na)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	s.Close()
	if err := s.View(context.Background(), func(*Tx) error { return nil }); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("view of a closed snapshot: %v", err)
	}
}
