package engine

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/admission"
)

// Through Engine.Checkpoint, with one slot: while sandbox a's checkpoint
// holds it (stopped at its scan), b queues, then c; c's reply becomes ready
// (its Urgent closes) while it waits, so c runs before b. A queued
// checkpoint whose context ends returns at once with the context's error and
// leaves its sandbox free for the next turn.
func TestAdmitEngineUrgentCheckpointOvertakes(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	e.locks.admit = admission.New(1)
	base := richBase(t)
	for _, n := range []string{"a", "b", "c", "d"} {
		res, err := e.CreateSandbox(ctx, delta.SandboxName(n), CreateOptions{Base: base})
		must(t, err)
		write(t, filepath.Join(res.Root, "turn.txt"), n)
	}
	queued, promoted := make(chan string, 8), make(chan string, 8)
	granted := make(chan string, 8)
	e.locks.admit.SetHooks(admission.Hooks{
		Queued:   func(sb string, _ bool) { queued <- sb },
		Promoted: func(sb string) { promoted <- sb },
		Granted:  func(sb string) { granted <- sb },
	})
	inA, block := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.opts.AtPhase = func(ph string) {
		if ph == PhaseScan {
			once.Do(func() { close(inA); <-block })
		}
	}
	done := make(chan string, 4)
	run := func(name string, opts CheckpointOptions) {
		go func() {
			r, err := e.Checkpoint(ctx, delta.SandboxName(name), opts)
			if err != nil || r.Class != delta.ClassFS {
				t.Errorf("checkpoint %s: %v %+v", name, err, r)
			}
			done <- name
		}()
	}
	run("a", CheckpointOptions{})
	<-inA
	run("b", CheckpointOptions{})
	if sb := <-queued; sb != "b" {
		t.Fatalf("queued %s, want b", sb)
	}
	urgent := make(chan struct{})
	run("c", CheckpointOptions{Urgent: urgent})
	if sb := <-queued; sb != "c" {
		t.Fatalf("queued %s, want c", sb)
	}
	dctx, cancel := context.WithCancel(ctx)
	derr := make(chan error, 1)
	go func() { _, err := e.Checkpoint(dctx, "d", CheckpointOptions{}); derr <- err }()
	if sb := <-queued; sb != "d" {
		t.Fatalf("queued %s, want d", sb)
	}
	cancel()
	if err := <-derr; !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "sandbox d") {
		t.Fatalf("cancelled checkpoint: %v", err)
	}
	close(urgent)
	if sb := <-promoted; sb != "c" {
		t.Fatalf("promoted %s, want c", sb)
	}
	close(block)
	// The slots go a, c, b. (They finish in about that order too, but a
	// slot is given back before the commit's fsyncs, so the ends may
	// overlap: the grants are the order admission decides.)
	for range 3 {
		<-done
	}
	for _, want := range []string{"a", "c", "b"} {
		if got := <-granted; got != want {
			t.Fatalf("slot granted to %s, want %s first (order a, c, b)", got, want)
		}
	}
	if r, err := e.Checkpoint(ctx, "d", CheckpointOptions{}); err != nil || r.Class != delta.ClassFS {
		t.Fatalf("d after its cancelled turn: %v %+v", err, r)
	}
	if got := <-granted; got != "d" {
		t.Fatalf("slot granted to %s, want d", got)
	}
	st := e.Admission().Stats()
	if st.Promoted != 1 || st.Cancelled != 1 || st.Urgent.Count != 1 || st.Normal.Count != 3 || st.Running != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestAdmitSlotFreedBeforeCommit: a checkpoint gives its slot back before
// its commit (fsyncs, no CPU), so with one slot another sandbox's turn runs
// whole while the first one's commit is held; the first still counts as
// urgent until it returns. Holding the slot through the commit had kept
// concurrent commits from ever sharing a group transaction.
func TestAdmitSlotFreedBeforeCommit(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	e.locks.admit = admission.New(1)
	base := richBase(t)
	for _, n := range []string{"a", "b"} {
		res, err := e.CreateSandbox(ctx, delta.SandboxName(n), CreateOptions{Base: base})
		must(t, err)
		write(t, filepath.Join(res.Root, "turn.txt"), n)
	}
	inCommit, block := make(chan struct{}), make(chan struct{})
	unblock := sync.OnceFunc(func() { close(block) })
	defer unblock()       // a failed check must not leave a blocked for the engine's Close
	var first atomic.Bool // only a's commit is held (Once would hold b's too)
	e.opts.AtPhase = func(ph string) {
		if ph == PhaseCommit && first.CompareAndSwap(false, true) {
			close(inCommit)
			<-block
		}
	}
	urgent := make(chan struct{})
	close(urgent)
	aDone := make(chan error, 1)
	go func() {
		_, err := e.Checkpoint(ctx, "a", CheckpointOptions{Urgent: urgent})
		aDone <- err
	}()
	<-inCommit
	if st := e.Admission().Stats(); st.Running != 0 {
		t.Fatalf("a holds its slot in the commit: %+v", st)
	}
	if got := e.locks.admit.UrgentRunning(); got != 1 {
		t.Fatalf("a in its commit counts as %d urgent checkpoints, want 1", got)
	}
	r, err := e.Checkpoint(ctx, "b", CheckpointOptions{})
	if err != nil || r.Class != delta.ClassFS {
		t.Fatalf("b while a commits: %v %+v", err, r)
	}
	unblock()
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	if got := e.locks.admit.UrgentRunning(); got != 0 {
		t.Fatalf("%d urgent checkpoints after a returned", got)
	}
}
