package catalog

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// put adds a checkpoint and returns its ID.
func put(t *testing.T, c *Catalog, cp *delta.Checkpoint) delta.ID {
	t.Helper()
	update(t, c, func(tx *Tx) error { return tx.PutCheckpoint(cp) })
	return cp.ID
}

func ids(cps []*delta.Checkpoint) []delta.ID {
	out := make([]delta.ID, len(cps))
	for i, cp := range cps {
		out[i] = cp.ID
	}
	return out
}

func sorted(in ...delta.ID) []delta.ID {
	out := slices.Clone(in)
	slices.SortFunc(out, func(a, b delta.ID) int { return strings.Compare(a.String(), b.String()) })
	return out
}

// Lineage: main has a0 → a1 → a2; branch b is created from a1 and has b0 → b1.
func TestLineage(t *testing.T) {
	c := openTest(t)
	a0 := put(t, c, testRecord("main", delta.ID{}, 0, t0))
	a1 := put(t, c, testRecord("main", a0, 1, t0.Add(time.Second)))
	a2 := put(t, c, testRecord("main", a1, 2, t0.Add(2*time.Second)))
	b0 := put(t, c, testRecord("branch", a1, 2, t0.Add(3*time.Second)))
	b1 := put(t, c, testRecord("branch", b0, 3, t0.Add(4*time.Second)))

	view(t, c, func(tx *Tx) error {
		kids, err := tx.Children(a1)
		if err != nil || !slices.Equal(kids, sorted(a2, b0)) {
			t.Errorf("children of a1: %v %v", kids, err)
		}
		if kids, err := tx.Children(b1); err != nil || len(kids) != 0 {
			t.Errorf("children of leaf: %v %v", kids, err)
		}
		if roots, err := tx.Children(delta.ID{}); err != nil || !slices.Equal(roots, []delta.ID{a0}) {
			t.Errorf("roots: %v %v", roots, err)
		}
		anc, err := tx.Ancestors(b1, 0)
		if err != nil || !slices.Equal(ids(anc), []delta.ID{b1, b0, a1, a0}) {
			t.Errorf("ancestors of b1: %v %v", ids(anc), err)
		}
		anc, err = tx.Ancestors(b1, 2)
		if err != nil || !slices.Equal(ids(anc), []delta.ID{b1, b0}) {
			t.Errorf("ancestors of b1, limit 2: %v %v", ids(anc), err)
		}
		return nil
	})

	// Deleting a1 removes its record and index keys; lineage through it now
	// reports the gap by name.
	update(t, c, func(tx *Tx) error { return tx.DeleteCheckpoint(a1) })
	view(t, c, func(tx *Tx) error {
		if _, err := tx.Checkpoint(a1); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), a1.String()) {
			t.Errorf("deleted checkpoint: %v", err)
		}
		if kids, _ := tx.Children(a0); len(kids) != 0 {
			t.Errorf("children of a0 after delete: %v", kids)
		}
		_, err := tx.Ancestors(b1, 0)
		if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "parent of "+b0.String()) {
			t.Errorf("ancestors across a gap: %v", err)
		}
		cps, _ := tx.SandboxCheckpoints("main")
		if !slices.Equal(ids(cps), []delta.ID{a0, a2}) {
			t.Errorf("main after delete: %v", ids(cps))
		}
		return nil
	})
	err := c.Update(t.Context(), func(tx *Tx) error { return tx.DeleteCheckpoint(a1) })
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
}

func TestPutCheckpoint(t *testing.T) {
	c := openTest(t)
	cp := testRecord("s", delta.ID{}, 0, t0)
	id := put(t, c, cp)
	if _, want, _ := delta.EncodeRecord(cp); id != want {
		t.Fatalf("PutCheckpoint set ID %s, want %s", id, want)
	}
	err := c.Update(t.Context(), func(tx *Tx) error { return tx.PutCheckpoint(testRecord("s", delta.ID{}, 0, t0)) })
	if !errors.Is(err, errdefs.ErrExists) || !strings.Contains(err.Error(), id.String()) {
		t.Fatalf("duplicate: %v", err)
	}
	bad := testRecord("s", delta.ID{}, 1, t0)
	bad.ID = id
	if err := c.Update(t.Context(), func(tx *Tx) error { return tx.PutCheckpoint(bad) }); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("wrong ID: %v", err)
	}
	// A record altered in the catalog is caught on read.
	data, _, _ := delta.EncodeRecord(testRecord("s", delta.ID{}, 9, t0))
	if err := c.db.Update(func(txn *badger.Txn) error { return txn.Set(checkpointKey(id), data) }); err != nil {
		t.Fatal(err)
	}
	err = c.View(t.Context(), func(tx *Tx) error { _, err := tx.Checkpoint(id); return err })
	if !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), id.String()) {
		t.Fatalf("tampered record: %v", err)
	}
	err = c.View(t.Context(), func(tx *Tx) error { return tx.ForEachCheckpoint(func(*delta.Checkpoint) error { return nil }) })
	if !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("ForEachCheckpoint over a tampered record: %v", err)
	}
}

func TestSandboxCheckpointsOrder(t *testing.T) {
	c := openTest(t)
	// Inserted out of order, with two checkpoints in the same nanosecond and
	// one before 1970; a neighbouring sandbox whose name extends this one's
	// must not leak in.
	times := []time.Time{t0.Add(time.Hour), t0, t0.Add(-time.Hour), t0, time.Unix(-5, 0), t0.Add(time.Nanosecond)}
	var all []*delta.Checkpoint
	for i, tm := range times {
		cp := testRecord("s", delta.ID{}, i, tm)
		put(t, c, cp)
		all = append(all, cp)
		put(t, c, testRecord("s2", delta.ID{}, i, tm))
	}
	slices.SortFunc(all, func(a, b *delta.Checkpoint) int {
		if d := a.Created.Compare(b.Created); d != 0 {
			return d
		}
		return strings.Compare(a.ID.String(), b.ID.String())
	})
	view(t, c, func(tx *Tx) error {
		got, err := tx.SandboxCheckpoints("s")
		if err != nil || !slices.Equal(ids(got), ids(all)) {
			t.Errorf("order: got %v, want %v (%v)", ids(got), ids(all), err)
		}
		if none, err := tx.SandboxCheckpoints("nobody"); err != nil || len(none) != 0 {
			t.Errorf("unknown sandbox: %v %v", none, err)
		}
		n := 0
		if err := tx.ForEachCheckpoint(func(*delta.Checkpoint) error { n++; return nil }); err != nil || n != 2*len(times) {
			t.Errorf("ForEachCheckpoint saw %d, %v", n, err)
		}
		return nil
	})
}

// ForEachCheckpoint pages through its iterator, so it must see every record
// exactly once across pages, even when the callback writes.
func TestForEachCheckpointPaging(t *testing.T) {
	c := openTest(t)
	const n = 3*scanPage + 7
	update(t, c, func(tx *Tx) error {
		for i := 0; i < n; i++ {
			if err := tx.PutCheckpoint(testRecord("s", delta.ID{}, i, t0)); err != nil {
				return err
			}
		}
		return nil
	})
	seen := make(map[delta.ID]bool)
	update(t, c, func(tx *Tx) error {
		return tx.ForEachCheckpoint(func(cp *delta.Checkpoint) error {
			if seen[cp.ID] {
				return fmt.Errorf("%s seen twice", cp.ID)
			}
			seen[cp.ID] = true
			_, err := tx.Children(cp.ID) // nested read while "iterating"
			if err != nil {
				return err
			}
			return tx.DeleteCheckpoint(cp.ID)
		})
	})
	if len(seen) != n {
		t.Fatalf("saw %d of %d", len(seen), n)
	}
}
