package admission

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// admitRig drives an admission scheduler deterministically: each acquire
// runs in its own goroutine, and the rig waits for the scheduler's hook to
// say it is queued before starting the next, so arrival order is exact.
type admitRig struct {
	t        *testing.T
	a        *Scheduler
	queued   chan string
	promoted chan string
	granted  chan grant
}

type grant struct {
	name    string
	release func()
}

func newAdmitRig(t *testing.T, slots int) *admitRig {
	r := &admitRig{t: t, a: New(slots), queued: make(chan string, 64), promoted: make(chan string, 64), granted: make(chan grant, 64)}
	r.a.SetHooks(Hooks{
		Queued:   func(sb string, _ bool) { r.queued <- sb },
		Promoted: func(sb string) { r.promoted <- sb },
	})
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
		if st := r.a.Stats(); st.Running != 1 {
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
	st := r.a.Stats()
	if st.Waiting != 5 || st.UrgentWaiting != 2 || st.Promoted != 1 || st.Running != 1 || st.Slots != 1 {
		t.Fatalf("stats %+v, want 5 waiting, 2 urgent, 1 promoted, 1 running of 1", st)
	}
	r.order(release, "promoted", "urgent", "n1", "n2", "n3")
	st = r.a.Stats()
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
	if st := r.a.Stats(); st.Waiting != 1 || st.Cancelled != 1 {
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
		before := r.a.Stats().Yields
		go func() { r.a.Yield(context.Background()); close(done) }()
		for r.a.Stats().Yields == before { // it counts itself before it blocks
			runtime.Gosched()
		}
		return done
	}
	r.a.Yield(context.Background()) // nothing urgent: returns at once
	later := make(chan struct{})
	rel, err := r.a.acquire(context.Background(), "a", later)
	if err != nil {
		t.Fatal(err)
	}
	close(later) // the reply is ready while the checkpoint runs
	for r.a.Stats().UrgentWaiting == 0 && !urgentRunning(r.a) {
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
	if st := r.a.Stats(); st.Yields != 1 || st.Running != 0 {
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
	if st := r.a.Stats(); st.Yields != 1 {
		t.Fatalf("stats %+v, want the one yield", st)
	}
	for range 3 {
		y(context.Background()) // nothing left to wait
	}
	if st := r.a.Stats(); st.Yields != 1 {
		t.Fatalf("stats %+v: a yielder past its budget queued again", st)
	}

	// A fresh one returns as soon as the urgent checkpoint ends.
	y = r.a.yielder(time.Hour)
	done := make(chan struct{})
	go func() { y(context.Background()); close(done) }()
	for r.a.Stats().Yields == 1 {
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

func urgentRunning(a *Scheduler) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.urgentRunning > 0
}

// Many checkpoints at once, urgent or not, promoted or not, cancelled or
// not: never more than the slots run, and every one is admitted or gone.
func TestAdmitConcurrentBound(t *testing.T) {
	a := New(2)
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
	st := a.Stats()
	if peak.Load() > 2 || st.Running != 0 || st.Waiting != 0 || st.UrgentWaiting != 0 || urgentRunning(a) {
		t.Fatalf("peak %d running, stats %+v", peak.Load(), st)
	}
	if got := st.Normal.Count + st.Urgent.Count + st.Cancelled; got != 64 {
		t.Fatalf("%d admitted or cancelled of 64", got)
	}
}

// acquire is admit for the tests that need only the whole release.
func (a *Scheduler) acquire(ctx context.Context, sandbox string, urgent <-chan struct{}) (release func(), err error) {
	s, err := a.Admit(ctx, sandbox, urgent)
	if err != nil {
		return nil, err
	}
	return s.Done, nil
}
