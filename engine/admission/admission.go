// Package admission is the checkpoint admission scheduler: it bounds how
// many checkpoints run their heavy phases at once, lets urgent ones go
// first, and makes background work give way to them.
package admission

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"
)

// Scheduler is checkpoint admission (docs/ARCHITECTURE.md, "Concurrency").
//
// Checkpoints of different sandboxes run side by side, but a checkpoint is
// CPU and I/O bound (scan, hash, compress, store), so past a few at once
// each one only gets slower. The engine admits at most Options.MaxCheckpoints
// (default GOMAXPROCS) to their heavy phases at once; the others wait in
// arrival order, except urgent ones, which go first.
//
// A checkpoint is urgent when someone waits for it right now: the LLM
// proxy's gate holds a model reply that is ready before the checkpoint
// committed (llmproxy.Turn.Urgent, passed as CheckpointOptions.Urgent). A
// checkpoint may arrive urgent or be promoted while it waits. Urgency is
// inherited backwards within a sandbox: an urgent waiter makes the earlier
// waiters of its sandbox urgent too, so one sandbox's checkpoints are always
// admitted in their arrival order. (Engine.Checkpoint already holds the
// sandbox's FIFO lock when it asks, so in the engine at most one per
// sandbox waits here; the rule keeps the scheduler right on its own.)
//
// Background work that no one waits for (the background freeze of frozen
// layers, the pusher's rounds) yields to urgent checkpoints: it waits,
// for at most yieldMax, while any urgent checkpoint waits or runs.
//
// A nil *Scheduler admits everything at once and never makes anyone yield.
type Scheduler struct {
	mu            sync.Mutex
	slots         int // <= 0: unlimited
	running       int
	urgentRunning int
	urgentWaiting int
	waiters       []*admitWaiter // in arrival order
	yielders      []chan struct{}
	stats         Stats
	hooks         Hooks
}

// Hooks let tests see the scheduler's decisions as they happen, so they
// can drive it in an exact order. Queued and Promoted are called without
// the scheduler's lock held; Granted is called under it and must not block.
type Hooks struct {
	Queued   func(sandbox string, urgent bool) // a waiter joined the queue
	Promoted func(sandbox string)              // a waiter was promoted by its urgent channel
	Granted  func(sandbox string)              // a slot was granted
}

// SetHooks installs h, replacing any earlier hooks. Tests call it before
// the scheduler's first use.
func (a *Scheduler) SetHooks(h Hooks) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hooks = h
}

type admitWaiter struct {
	sandbox string
	urgent  bool
	granted bool
	since   time.Time
	ready   chan struct{} // closed once granted
}

// yieldMax bounds how long background work yields: urgent checkpoints go
// first, but a stream of them must not starve the freezes and uploads
// forever.
const yieldMax = 5 * time.Second

// WaitBounds are the upper bounds, in seconds, of the admission wait
// histogram in Stats.
var WaitBounds = [...]float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// Stats is a snapshot of the checkpoint admission scheduler, for
// metrics (package server serves it on /metrics).
type Stats struct {
	// Slots is how many checkpoints may run at once (0: unlimited).
	Slots int
	// Running, Waiting and UrgentWaiting are the checkpoints admitted and
	// not done, and those queued (of which urgent).
	Running, Waiting, UrgentWaiting int
	// Normal and Urgent are the admissions so far, by the lane they were
	// admitted in, with their waits.
	Normal, Urgent Lane
	// Promoted counts waiters promoted to urgent while they waited;
	// Cancelled, waiters whose context ended first.
	Promoted, Cancelled uint64
	// Yields counts background tasks that waited for urgent checkpoints.
	Yields uint64
}

// Lane is one lane's admissions and the time they waited.
type Lane struct {
	Count   uint64
	WaitSum time.Duration
	// Buckets[i] counts waits of at most WaitBounds[i] seconds (not
	// cumulative); the waits above the last bound are Count minus the sum.
	Buckets [len(WaitBounds)]uint64
}

func (l *Lane) observe(d time.Duration) {
	l.Count++
	l.WaitSum += d
	for i, b := range WaitBounds {
		if d.Seconds() <= b {
			l.Buckets[i]++
			return
		}
	}
}

// New makes the scheduler for at most max checkpoints at once (the
// engine's Options.MaxCheckpoints): 0 is GOMAXPROCS (one checkpoint per
// core: their work is mostly CPU, hashing and compressing), negative is
// unlimited.
func New(max int) *Scheduler {
	if max == 0 {
		max = runtime.GOMAXPROCS(0)
	}
	return &Scheduler{slots: max}
}

// Slot is a granted slot. Free gives the slot back while the
// checkpoint goes on (its commit: fsyncs, no CPU), still counted as urgent
// for the background work that yields to urgent checkpoints; Done ends it
// (and frees the slot if Free was not called). Both may be called more
// than once.
type Slot struct{ Free, Done func() }

// Admit waits for a checkpoint slot for sandbox. urgent, if not nil, is
// closed when the checkpoint becomes urgent (it may be closed already).
// A cancelled ctx removes the waiter from the queue and returns ctx's error.
func (a *Scheduler) Admit(ctx context.Context, sandbox string, urgent <-chan struct{}) (Slot, error) {
	if a == nil {
		return Slot{Free: func() {}, Done: func() {}}, nil
	}
	isUrgent := urgent != nil && isClosed(urgent)
	now := time.Now()
	a.mu.Lock()
	if a.slots <= 0 || (a.running < a.slots && len(a.waiters) == 0) {
		w := &admitWaiter{sandbox: sandbox, urgent: isUrgent, since: now}
		a.grantLocked(w)
		a.mu.Unlock()
		return a.releaser(w, urgent), nil
	}
	w := &admitWaiter{sandbox: sandbox, since: now, ready: make(chan struct{})}
	a.waiters = append(a.waiters, w)
	if isUrgent {
		a.promoteLocked(w, true)
	}
	onQueued := a.hooks.Queued
	a.mu.Unlock()
	if onQueued != nil {
		onQueued(sandbox, isUrgent)
	}
	if isUrgent {
		urgent = nil
	}
	for {
		select {
		case <-w.ready:
			return a.releaser(w, urgent), nil
		case <-urgent:
			urgent = nil
			a.mu.Lock()
			onPromote := a.hooks.Promoted
			if w.granted { // admitted meanwhile: it runs urgent from now on
				if !w.urgent {
					w.urgent = true
					a.urgentRunning++
				}
				onPromote = nil
			} else {
				a.promoteLocked(w, false)
			}
			a.mu.Unlock()
			if onPromote != nil {
				onPromote(sandbox)
			}
		case <-ctx.Done():
			a.mu.Lock()
			if w.granted { // granted just as ctx ended: pass the slot on
				a.mu.Unlock()
				a.releaser(w, nil).Done()
			} else {
				a.removeLocked(w)
				a.stats.Cancelled++
				a.mu.Unlock()
			}
			return Slot{}, fmt.Errorf("sandbox %s: waiting for a checkpoint slot: %w", sandbox, ctx.Err())
		}
	}
}

// promoteLocked makes w and the earlier waiters of its sandbox urgent;
// arrived says w came urgent (it is not counted as promoted).
func (a *Scheduler) promoteLocked(w *admitWaiter, arrived bool) {
	for _, o := range a.waiters {
		if o.sandbox == w.sandbox && !o.urgent {
			o.urgent = true
			a.urgentWaiting++
			if o != w || !arrived {
				a.stats.Promoted++
			}
		}
		if o == w {
			break
		}
	}
}

func (a *Scheduler) removeLocked(w *admitWaiter) {
	for i, o := range a.waiters {
		if o == w {
			a.waiters = append(a.waiters[:i], a.waiters[i+1:]...)
			break
		}
	}
	if w.urgent {
		a.urgentWaiting--
		a.wakeYieldersLocked()
	}
}

// grantLocked admits w (already out of the queue).
func (a *Scheduler) grantLocked(w *admitWaiter) {
	w.granted = true
	a.running++
	if a.hooks.Granted != nil {
		a.hooks.Granted(w.sandbox)
	}
	lane := &a.stats.Normal
	if w.urgent {
		a.urgentRunning++
		lane = &a.stats.Urgent
	}
	lane.observe(time.Since(w.since))
	if w.ready != nil {
		close(w.ready)
	}
}

// dispatchLocked fills free slots: the first urgent waiter, else the first.
func (a *Scheduler) dispatchLocked() {
	for a.running < a.slots && len(a.waiters) > 0 {
		i := 0
		if a.urgentWaiting > 0 {
			for j, w := range a.waiters {
				if w.urgent {
					i = j
					break
				}
			}
		}
		w := a.waiters[i]
		a.waiters = append(a.waiters[:i], a.waiters[i+1:]...)
		if w.urgent {
			a.urgentWaiting--
		}
		a.grantLocked(w)
	}
}

// releaser returns w's release. A checkpoint admitted in the normal lane
// that becomes urgent while it runs (urgent closes) counts as urgent from
// then on, so background work yields to it.
func (a *Scheduler) releaser(w *admitWaiter, urgent <-chan struct{}) Slot {
	done := make(chan struct{})
	if !w.urgent && urgent != nil {
		go func() {
			select {
			case <-urgent:
				a.mu.Lock()
				if !isClosed(done) {
					w.urgent = true
					a.urgentRunning++
				}
				a.mu.Unlock()
			case <-done:
			}
		}()
	}
	var freeOnce, doneOnce sync.Once
	free := func() {
		freeOnce.Do(func() {
			a.mu.Lock()
			defer a.mu.Unlock()
			a.running--
			a.dispatchLocked()
		})
	}
	return Slot{Free: free, Done: func() {
		doneOnce.Do(func() {
			free()
			a.mu.Lock()
			defer a.mu.Unlock()
			close(done)
			if w.urgent {
				a.urgentRunning--
			}
			a.wakeYieldersLocked()
		})
	}}
}

func (a *Scheduler) wakeYieldersLocked() {
	if a.urgentRunning+a.urgentWaiting > 0 {
		return
	}
	for _, y := range a.yielders {
		close(y)
	}
	a.yielders = nil
}

// Yield is background work's courtesy (the background freeze, the
// daemon's pusher): it returns once no urgent checkpoint waits or runs,
// after at most a few seconds (yieldMax), or when ctx ends.
func (a *Scheduler) Yield(ctx context.Context) { a.yieldFor(ctx, yieldMax) }

// Yielder is Yield for one piece of background work that gives way many
// times (a push round, before each upload: PushOptions.Yield): each call
// returns once no urgent checkpoint waits or runs, and all calls together
// wait at most yieldMax, so a stream of urgent checkpoints slows the work
// but never stops it.
func (a *Scheduler) Yielder() func(context.Context) { return a.yielder(yieldMax) }

// yielder is Yielder with its budget: calls may run at once; each one's
// wait is taken from the budget.
func (a *Scheduler) yielder(budget time.Duration) func(context.Context) {
	var mu sync.Mutex
	left := budget
	return func(ctx context.Context) {
		mu.Lock()
		d := left
		mu.Unlock()
		if d <= 0 {
			return
		}
		start := time.Now()
		a.yieldFor(ctx, d)
		mu.Lock()
		left -= time.Since(start)
		mu.Unlock()
	}
}

// yieldFor is Yield waiting at most d.
func (a *Scheduler) yieldFor(ctx context.Context, d time.Duration) {
	if a == nil {
		return
	}
	a.mu.Lock()
	if a.urgentRunning+a.urgentWaiting == 0 {
		a.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	a.yielders = append(a.yielders, ch)
	a.stats.Yields++
	a.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
	}
}

// Stats reports the scheduler's queue and counters.
func (a *Scheduler) Stats() Stats {
	if a == nil {
		return Stats{}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.stats
	st.Slots = max(a.slots, 0)
	st.Running, st.Waiting, st.UrgentWaiting = a.running, len(a.waiters), a.urgentWaiting
	return st
}

// UrgentRunning is how many urgent checkpoints run (slot held, or given
// back for the commit and not yet done): what background work yields to.
func (a *Scheduler) UrgentRunning() int {
	if a == nil {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.urgentRunning
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
