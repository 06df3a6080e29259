package engine

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
)

// A small turn's commit is one catalog transaction: its blob index and
// refcounts go into the transaction that adds the checkpoint (one fsync,
// not two), and its chunks and trees into one pack. A turn too large for
// one transaction still indexes its blobs first, in transactions of their
// own.
func TestSmallTurnCommitsOnce(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr := smallSandbox(t, e, "s")
	// turn changes files files and checkpoints, and says how many catalog
	// transactions the checkpoint committed.
	turn := func(files int, tag string) (*CheckpointResult, int64) {
		for i := range files {
			write(t, filepath.Join(cr.Root, "d", fmt.Sprintf("f%04d", i)), fmt.Sprintf("%s file %d\n", tag, i))
		}
		e.WaitFreezes() // a background freeze may write the catalog too
		before := e.cat.Updates()
		r, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
		must(t, err)
		if r.Class != delta.ClassFS {
			t.Fatalf("%s: class %s", tag, r.Class)
		}
		return r, e.cat.Updates() - before
	}
	turn(10, "first")
	if r, n := turn(10, "second"); n != 1 || r.Stats.ObjectsNew != 1 {
		t.Errorf("a 10-file turn: %d catalog transactions and %d packs, want 1 and 1", n, r.Stats.ObjectsNew)
	}
	// More new blobs than one transaction indexes (content's groupBlobs).
	const large = 300
	if _, n := turn(large, "large"); n < 2 {
		t.Errorf("a turn of %d new files: %d catalog transaction(s), want its index in its own", large, n)
	}
	checkAll(t, e)
}

// A checkpoint whose catalog transaction fails after its record is in the
// store keeps the packs the record names: the store-only verify (the
// final oracle of openEngine) reads every record, this one included. The
// catalog neither knows the checkpoint nor counts its references, and the
// sandbox's next turn commits.
func TestFailedCommitKeepsRecordedPacks(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := newEngine(t)
	cr := smallSandbox(t, e, "s")
	write(t, filepath.Join(cr.Root, "one.txt"), "turn one\n")
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	write(t, filepath.Join(cr.Root, "two.txt"), "turn two, whose commit fails\n")
	e.opts.AtPhase = func(p string) {
		if p == PhaseRecorded {
			cancel()
		}
	}
	if _, err := e.Checkpoint(ctx, "s", CheckpointOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("checkpoint cancelled after its record: %v, want context.Canceled", err)
	}
	e.opts.AtPhase = nil
	ctx = context.Background()
	if _, err := e.Verifier().VerifyStore(ctx, mustRef("")); err != nil {
		t.Fatalf("store-only verify after the failed commit: %v", err)
	}
	checkAll(t, e)
	r, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	if r.Class != delta.ClassFS || r.Parent != c1.ID {
		t.Fatalf("the turn after: class %s, parent %s; want fs on %s", r.Class, r.Parent.Short(), c1.ID.Short())
	}
	checkAll(t, e)
}
