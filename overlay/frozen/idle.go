package frozen

import "time"

// When a background freeze runs (docs/ARCHITECTURE.md, "Frozen layers").
// A freeze is disk and CPU work that no client waits for, and a turn is
// what clients wait for: on a busy daemon (many sandboxes closing turns
// back to back) every freeze that ran alongside the turns slowed them, and
// most were wasted, since by the time retention looks again the sandbox
// has moved on and only its newest layers are kept. So a queued freeze
// waits until no checkpoint has been in flight for freezeIdle, and then
// the retention rule skips those whose checkpoint the sandbox has left
// behind meanwhile. It waits at most freezeMaxDefer (a daemon that is
// never idle still gets its layers), and not at all when someone needs it:
// a branch of its checkpoint (or of a later one of its sandbox, which
// builds on it), WaitFreezes, or Close.

// freezeIdle is how long no checkpoint must have been in flight before a
// queued freeze starts: longer than the gap between two turns of a client
// that closes them back to back, far shorter than a model's reply.
const freezeIdle = 5 * time.Millisecond

// freezeMaxDefer bounds how long a queued freeze waits for the engine to
// be idle.
const freezeMaxDefer = 2 * time.Second

// turnStarted counts a checkpoint in flight until the returned func is
// called.
func (f *freezeJobs) turnStarted() (done func()) {
	f.mu.Lock()
	f.busy++
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.busy--
		f.lastEnd = time.Now()
		if f.busy == 0 {
			f.kickLocked()
		}
	}
}

// kickLocked wakes every freeze waiting for the engine to be idle, to look
// again. The caller holds f.mu.
func (f *freezeJobs) kickLocked() {
	if f.kick != nil {
		close(f.kick)
	}
	f.kick = make(chan struct{})
}

// waitIdle returns when j may start: the engine has been idle for
// freezeIdle, j is needed now (rushed, drained, closing), or it has
// waited freezeMaxDefer since it was queued.
func (f *freezeJobs) waitIdle(j *freezeJob) {
	for {
		f.mu.Lock()
		now := time.Now()
		if f.dueLocked(j, now) {
			f.mu.Unlock()
			return
		}
		wait := f.deadline(j).Sub(now)
		if f.busy == 0 {
			quiet := f.lastEnd.Add(freezeIdle).Sub(now)
			if quiet <= 0 {
				f.mu.Unlock()
				return
			}
			wait = min(wait, quiet)
		}
		f.sleepLocked(wait)
	}
}

// dueLocked reports whether j goes on now whatever the turns do: it is
// needed now (rushed, drained, closing) or has waited freezeMaxDefer since
// it was queued. The caller holds f.mu.
func (f *freezeJobs) dueLocked(j *freezeJob, now time.Time) bool {
	return j.rush || f.closed || f.draining > 0 || !now.Before(f.deadline(j))
}

// deadline is when j stops waiting for the turns.
func (f *freezeJobs) deadline(j *freezeJob) time.Time { return j.queued.Add(f.maxDeferOr()) }

// sleepLocked releases f.mu and waits up to d, or until a kick (a turn
// ended, a rush, a drain).
func (f *freezeJobs) sleepLocked(d time.Duration) {
	if f.kick == nil {
		f.kick = make(chan struct{})
	}
	kick := f.kick
	f.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-kick:
	case <-t.C:
	}
}

// pause returns once no checkpoint is in flight, or at once when j is
// needed now (rushed, drained, closing) or has waited freezeMaxDefer since
// it was queued. A running freeze calls it between entries
// (Source.Yield): a turn that arrives meanwhile then shares
// the cores with at most one entry's work of each freeze, not a layer's.
func (f *freezeJobs) pause(j *freezeJob) {
	counted := false
	for {
		f.mu.Lock()
		now := time.Now()
		if f.busy == 0 || f.dueLocked(j, now) {
			f.mu.Unlock()
			return
		}
		if !counted {
			counted = true
			f.paused.Add(1)
		}
		f.sleepLocked(f.deadline(j).Sub(now))
	}
}

// maxDeferOr is freezeMaxDefer, or the test's bound.
func (f *freezeJobs) maxDeferOr() time.Duration {
	if f.maxDefer > 0 {
		return f.maxDefer
	}
	return freezeMaxDefer
}

// rushLocked makes j and the sandbox's earlier pending freezes (which j
// builds on, so waits for) start without waiting for idle. The caller
// holds f.mu.
func (f *freezeJobs) rushLocked(j *freezeJob) {
	for p := j; p != nil && !p.rush; p = p.prev {
		p.rush = true
	}
	f.kickLocked()
}
