package engine

import (
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
)

// admitRig drives an admission scheduler deterministically: each acquire
// runs in its own goroutine, and the rig waits for the scheduler's hook to
// say it is queued before starting the next, so arrival order is exact.
type admitRig struct {
	t        *testing.T
	a        *admission
	queued   chan string
	promoted chan string
	granted  chan grant
}

type grant struct {
	name    string
	release func()
}

func newAdmitRig(t *testing.T, slots int) *admitRig {
	r := &admitRig{t: t, a: newAdmission(slots), queued: make(chan string, 64), promoted: make(chan string, 64), granted: make(chan grant, 64)}
	r.a.onQueued = func(sb string, _ bool) { r.queued <- sb }
	r.a.onPromote = func(sb string) { r.promoted <- sb }
	return r
}

// hold takes a slot at once.
func (r *admitRig) hold(sandbox string) func() {
	r.t.Helper()
	rel, err := r.a.acquire(context.Background(), sandbox, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	return rel
}

// wait starts a checkpoint that must queue; it returns its result channel.
func (r *admitRig) wait(ctx context.Context, name, sandbox string, urgent <-chan struct{}) chan error {
	errc := make(chan error, 1)
	go func() {
		rel, err := r.a.acquire(ctx, sandbox, urgent)
		errc <- err
		if err == nil {
			r.granted <- grant{name, rel}
		}
	}()
	if got := <-r.queued; got != sandbox {
		r.t.Fatalf("queued %s, want %s", got, sandbox)
	}
	return errc
}

// order releases what holds the slot and checks that the queue is then
// admitted in the order want, one at a time.
func (r *admitRig) order(release func(), want ...string) {
	r.t.Helper()
	release()
	for _, w := range want {
		g := <-r.granted
		if g.name != w {
			r.t.Fatalf("admitted %s, want %s (order %v)", g.name, w, want)
		}
		if st := r.a.snapshot(); st.Running != 1 {
			r.t.Fatalf("%d running with one slot", st.Running)
		}
		g.release()
	}
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// An urgent checkpoint overtakes the normal ones queued before it, and a
// waiting one promoted to urgent does too; urgent ones go in arrival order.
func TestAdmitUrgentOvertakesAndPromotion(t *testing.T) {
	r := newAdmitRig(t, 1)
	ctx := context.Background()
	release := r.hold("h")
	r.wait(ctx, "n1", "a", nil)
	r.wait(ctx, "n2", "b", nil)
	later := make(chan struct{})
	r.wait(ctx, "promoted", "c", later)
	r.wait(ctx, "n3", "d", nil)
	r.wait(ctx, "urgent", "e", closedChan())
	close(later)
	if got := <-r.promoted; got != "c" {
		t.Fatalf("promoted %s, want c", got)
	}
	st := r.a.snapshot()
	if st.Waiting != 5 || st.UrgentWaiting != 2 || st.Promoted != 1 || st.Running != 1 || st.Slots != 1 {
		t.Fatalf("stats %+v, want 5 waiting, 2 urgent, 1 promoted, 1 running of 1", st)
	}
	r.order(release, "promoted", "urgent", "n1", "n2", "n3")
	st = r.a.snapshot()
	if st.Urgent.Count != 2 || st.Normal.Count != 4 || st.Waiting != 0 || st.Running != 0 {
		t.Fatalf("stats %+v, want 2 urgent and 4 normal admissions, nothing left", st)
	}
}

// A sandbox's checkpoints are admitted in their arrival order: an urgent
// one makes the earlier ones of its sandbox urgent too, and they overtake
// the other sandboxes' together.
func TestAdmitUrgentKeepsSandboxOrder(t *testing.T) {
	r := newAdmitRig(t, 1)
	ctx := context.Background()
	release := r.hold("h")
	r.wait(ctx, "t1", "t", nil)
	r.wait(ctx, "s1", "s", nil)
	r.wait(ctx, "u1", "u", nil)
	r.wait(ctx, "s2", "s", closedChan())
	r.order(release, "s1", "s2", "t1", "u1")
}

// A waiter whose context ends leaves the queue and never takes a slot.
func TestAdmitCancelRemovesWaiter(t *testing.T) {
	r := newAdmitRig(t, 1)
	release := r.hold("h")
	ctx, cancel := context.WithCancel(context.Background())
	errc := r.wait(ctx, "gone", "a", nil)
	r.wait(context.Background(), "n1", "b", nil)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	if st := r.a.snapshot(); st.Waiting != 1 || st.Cancelled != 1 {
		t.Fatalf("stats %+v, want 1 waiting, 1 cancelled", st)
	}
	r.order(release, "n1")
}

// Background work yields while an urgent checkpoint waits or runs,
// including one admitted normally that became urgent while running.
func TestAdmitBackgroundYieldsToUrgent(t *testing.T) {
	r := newAdmitRig(t, 1)
	bg := func() chan struct{} {
		done := make(chan struct{})
		before := r.a.snapshot().Yields
		go func() { r.a.yield(context.Background()); close(done) }()
		for r.a.snapshot().Yields == before { // it counts itself before it blocks
			runtime.Gosched()
		}
		return done
	}
	r.a.yield(context.Background()) // nothing urgent: returns at once
	later := make(chan struct{})
	rel, err := r.a.acquire(context.Background(), "a", later)
	if err != nil {
		t.Fatal(err)
	}
	close(later) // the reply is ready while the checkpoint runs
	for r.a.snapshot().UrgentWaiting == 0 && !urgentRunning(r.a) {
		runtime.Gosched()
	}
	done := bg()
	r.wait(context.Background(), "u", "b", closedChan())
	rel()
	g := <-r.granted
	select {
	case <-done:
		t.Fatal("background work went ahead of a running urgent checkpoint")
	default:
	}
	g.release()
	<-done
	if st := r.a.snapshot(); st.Yields != 1 || st.Running != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A yielder's calls all give way to a running urgent checkpoint until
// their shared budget is spent; then they go ahead at once, the urgent one
// still running. After a call that waited its budget out (a short one
// here), the next call does not even queue.
func TestAdmitYielderBudget(t *testing.T) {
	r := newAdmitRig(t, 1)
	acquired, err := r.a.acquire(context.Background(), "a", closedChan())
	if err != nil {
		t.Fatal(err)
	}
	rel := sync.OnceFunc(acquired)
	defer rel()
	y := r.a.yielder(20 * time.Millisecond)
	y(context.Background()) // waits its budget out: the urgent one runs on
	if st := r.a.snapshot(); st.Yields != 1 {
		t.Fatalf("stats %+v, want the one yield", st)
	}
	for range 3 {
		y(context.Background()) // nothing left to wait
	}
	if st := r.a.snapshot(); st.Yields != 1 {
		t.Fatalf("stats %+v: a yielder past its budget queued again", st)
	}

	// A fresh one returns as soon as the urgent checkpoint ends.
	y = r.a.yielder(time.Hour)
	done := make(chan struct{})
	go func() { y(context.Background()); close(done) }()
	for r.a.snapshot().Yields == 1 {
		runtime.Gosched()
	}
	select {
	case <-done:
		t.Fatal("a yielder went ahead of a running urgent checkpoint")
	default:
	}
	rel()
	<-done
}

func urgentRunning(a *admission) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.urgentRunning > 0
}

// Many checkpoints at once, urgent or not, promoted or not, cancelled or
// not: never more than the slots run, and every one is admitted or gone.
func TestAdmitConcurrentBound(t *testing.T) {
	a := newAdmission(2)
	var running, peak atomic.Int64
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var urgent chan struct{}
			if i%3 == 0 {
				urgent = make(chan struct{})
				go close(urgent)
			}
			if i%7 == 0 {
				go cancel()
			}
			rel, err := a.acquire(ctx, []string{"a", "b", "c", "d"}[i%4], urgent)
			if err != nil {
				return
			}
			n := running.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			runtime.Gosched()
			running.Add(-1)
			rel()
		}()
	}
	wg.Wait()
	st := a.snapshot()
	if peak.Load() > 2 || st.Running != 0 || st.Waiting != 0 || st.UrgentWaiting != 0 || urgentRunning(a) {
		t.Fatalf("peak %d running, stats %+v", peak.Load(), st)
	}
	if got := st.Normal.Count + st.Urgent.Count + st.Cancelled; got != 64 {
		t.Fatalf("%d admitted or cancelled of 64", got)
	}
}

// Through Engine.Checkpoint, with one slot: while sandbox a's checkpoint
// holds it (stopped at its scan), b queues, then c; c's reply becomes ready
// (its Urgent closes) while it waits, so c runs before b. A queued
// checkpoint whose context ends returns at once with the context's error and
// leaves its sandbox free for the next turn.
func TestAdmitEngineUrgentCheckpointOvertakes(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	e.admit = newAdmission(1)
	base := richBase(t)
	for _, n := range []string{"a", "b", "c", "d"} {
		res, err := e.CreateSandbox(ctx, n, CreateOptions{Base: base})
		must(t, err)
		write(t, filepath.Join(res.Root, "turn.txt"), n)
	}
	queued, promoted := make(chan string, 8), make(chan string, 8)
	e.admit.onQueued = func(sb string, _ bool) { queued <- sb }
	e.admit.onPromote = func(sb string) { promoted <- sb }
	granted := make(chan string, 8)
	e.admit.onGrant = func(sb string) { granted <- sb }
	inA, block := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.atPhase = func(ph string) {
		if ph == PhaseScan {
			once.Do(func() { close(inA); <-block })
		}
	}
	done := make(chan string, 4)
	run := func(name string, opts CheckpointOptions) {
		go func() {
			r, err := e.Checkpoint(ctx, name, opts)
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
	st := e.AdmissionStats()
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
	e.admit = newAdmission(1)
	base := richBase(t)
	for _, n := range []string{"a", "b"} {
		res, err := e.CreateSandbox(ctx, n, CreateOptions{Base: base})
		must(t, err)
		write(t, filepath.Join(res.Root, "turn.txt"), n)
	}
	inCommit, block := make(chan struct{}), make(chan struct{})
	unblock := sync.OnceFunc(func() { close(block) })
	defer unblock()       // a failed check must not leave a blocked for the engine's Close
	var first atomic.Bool // only a's commit is held (Once would hold b's too)
	e.atPhase = func(ph string) {
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
	if st := e.AdmissionStats(); st.Running != 0 {
		t.Fatalf("a holds its slot in the commit: %+v", st)
	}
	if got := e.admit.urgentNow(); got != 1 {
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
	if got := e.admit.urgentNow(); got != 0 {
		t.Fatalf("%d urgent checkpoints after a returned", got)
	}
}

// urgentNow is how many urgent checkpoints run (slot held or committing).
func (a *admission) urgentNow() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.urgentRunning
}

// acquire is admit for the tests that need only the whole release.
func (a *admission) acquire(ctx context.Context, sandbox string, urgent <-chan struct{}) (release func(), err error) {
	s, err := a.admit(ctx, sandbox, urgent)
	if err != nil {
		return nil, err
	}
	return s.done, nil
}
