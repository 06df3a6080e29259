package track

import (
	"maps"
	"slices"

	"github.com/turnsnap/turnsnap/fstree"
)

// The record's life cycle (docs/TRACKING.md): a turn calls Changes before
// it scans, and Reset once that scan is committed; events that arrive in
// between stay for the next turn.

// Changes returns the paths changed since the last Reset, sorted, or the
// reason the record is unknown (the caller must walk). The paths stay in
// the record until Reset: a turn that is not committed builds on them.
func (t *Tracker) Changes() ([]string, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.drainLocked()
	if t.closed {
		return nil, ReasonClosed
	}
	if t.takenWhy == "" {
		t.takenWhy = t.pendingWhy
	}
	t.pendingWhy = ""
	if t.takenWhy != "" {
		clear(t.taken)
	} else {
		for p := range t.pending {
			if len(t.taken) >= maxTracked {
				t.takenWhy = ReasonTooMany
				clear(t.taken)
				break
			}
			t.taken[p] = true
		}
	}
	clear(t.pending)
	for p := range t.forcePending {
		t.forced[p] = true
	}
	clear(t.forcePending)
	if t.takenWhy != "" {
		return nil, t.takenWhy
	}
	for p := range t.forced {
		t.taken[p] = true
	}
	out := make([]string, 0, len(t.taken))
	for p := range t.taken {
		out = append(out, p)
	}
	slices.Sort(out)
	return out, ""
}

// Reset makes res, the scan that followed the last Changes, the new base:
// it is committed (or equal to the head), and what arrived since that
// Changes call stays in the record.
func (t *Tracker) Reset(res *fstree.ScanResult) {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.taken)
	clear(t.forced)
	t.takenWhy = ""
	t.last = res
}

// Quiet drops the events process pid makes from now until the returned
// end is called. It is for a writer whose result becomes the tracker's
// next base, such as a restore writing through the mount (restoreDiff):
// its writes are no change to record, and reading them back would cost
// the next turn a listing of every directory they touched. end reads the
// kernel queue dry first: fanotify queues an event before the write that
// made it returns, so every event of the writes made before end is
// dropped, and none made after. The caller must make sure no other write
// of pid's reaches the mount meanwhile (the engine holds the sandbox's
// operation); other processes' events are recorded as always.
func (t *Tracker) Quiet(pid int) (end func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.drainLocked() // what came before is recorded
	t.quiet = int32(pid)
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		t.drainLocked()
		t.quiet = 0
	}
}

// Reread names files whose changes make no event and need not move their
// stat (files a process maps shared and writable): the next scan reads
// them, tracked or walked, whatever the cache says. Paths are
// root-relative.
func (t *Tracker) Reread(paths []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range paths {
		t.forcePending[p] = true
	}
}

// RereadSet is the forced paths of the scan in progress (after Changes).
func (t *Tracker) RereadSet() map[string]bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.forced) == 0 {
		return nil
	}
	return maps.Clone(t.forced)
}

// Lost says events may have been missed (a failed turn that may have left
// the record's base inconsistent, a writer the marks do not see): the
// next turn walks.
func (t *Tracker) Lost() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lostLocked(ReasonLost)
	t.takenWhy, t.last = ReasonLost, nil
	clear(t.taken)
}

// Unsure says the next scan cannot trust the record (a writer the marks
// do not see, such as a shared writable mapping): it walks, building on
// the base, and the record is whole again after the Reset that follows.
func (t *Tracker) Unsure(reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lostLocked(reason)
}

// Stats returns the tracker's counters.
func (t *Tracker) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats
}

// Base returns the scan last passed to Reset (nil before the first, and
// after Lost): a committed state, whose cache a caller that saves scan
// caches lazily writes when it stops tracking.
func (t *Tracker) Base() *fstree.ScanResult { return t.base() }

func (t *Tracker) base() *fstree.ScanResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.last
}
