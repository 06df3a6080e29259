package engine

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/overlay"
)

// Change tracking (docs/TRACKING.md). With Options.TrackChanges a
// long-lived engine (the daemon) keeps one overlay.Tracker per overlay
// sandbox it has checkpointed, from the first checkpoint until the sandbox
// is rolled back, removed or the engine closes. A turn then scans only what
// the kernel's change events name, and an unchanged turn touches nothing.
// Whenever the events may be incomplete the turn walks, never skips.

// TrackingStats counts what change tracking did, for the daemon's metrics.
type TrackingStats struct {
	// TrackedScans counts turns decided from the change record, without a
	// walk; UnchangedTurns those of them whose record was empty (nothing
	// was read or listed).
	TrackedScans   uint64
	UnchangedTurns uint64
	// PathsScanned totals the changed paths tracked scans were given.
	PathsScanned uint64
	// Walks counts turns that fell back to the full incremental walk, by
	// reason (overlay.Reason*: start, overflow, read, unresolved,
	// too-many, lost, hardlink, remount).
	Walks map[string]uint64
	// Overflows counts kernel event-queue overflows (FAN_Q_OVERFLOW);
	// Events the events read; StartFailures trackers that could not start.
	Overflows     uint64
	Events        uint64
	StartFailures uint64
}

// trackers is the engine's per-sandbox change tracking.
type trackers struct {
	on   bool
	opts overlay.TrackOptions // tests set NoDrain
	mu   sync.Mutex
	m    map[string]*overlay.Tracker
	// counters of trackers already closed, plus the turn counters
	tracked, unchanged, paths, startFails atomic.Uint64
	closedStats                           overlay.TrackStats
	walks                                 map[string]uint64
}

// TrackingStats returns the change-tracking counters.
func (e *Engine) TrackingStats() TrackingStats {
	t := &e.track
	t.mu.Lock()
	defer t.mu.Unlock()
	out := TrackingStats{
		TrackedScans: t.tracked.Load(), UnchangedTurns: t.unchanged.Load(), PathsScanned: t.paths.Load(),
		StartFailures: t.startFails.Load(), Overflows: t.closedStats.Overflows, Events: t.closedStats.Events,
		Walks: map[string]uint64{},
	}
	for k, v := range t.walks {
		out.Walks[k] = v
	}
	for _, tr := range t.m {
		s := tr.Stats()
		out.Overflows += s.Overflows
		out.Events += s.Events
	}
	return out
}

// turnScan is one checkpoint's scan with what it needs to settle the
// tracker afterwards: done(res) once res is committed or equal to the
// head, and failed otherwise (deferred: a no-op after done).
type turnScan struct {
	tr      *overlay.Tracker
	settled bool
}

func (s *turnScan) done(res *delta.ScanResult) {
	if s.tr != nil && !s.settled {
		s.settled = true
		s.tr.Reset(res)
	}
}

func (s *turnScan) failed() {
	if s.tr != nil && !s.settled {
		s.settled = true
		s.tr.Lost()
	}
}

// scanRoot scans sandbox name's root for a checkpoint: through its change
// tracker when tracking is on and the root is an overlay, else by walking.
func (e *Engine) scanRoot(ctx context.Context, name string, st *sandboxState, saver delta.BlobSaver) (*delta.ScanResult, *turnScan, error) {
	r, ok := st.root.(*overlay.Root)
	if !e.track.on || !ok {
		res, err := st.root.Scan(ctx, saver)
		return res, &turnScan{}, err
	}
	tr := e.tracker(name, r)
	if tr == nil {
		e.countWalk("start-failed")
		res, err := st.root.Scan(ctx, saver)
		return res, &turnScan{}, err
	}
	ts := &turnScan{tr: tr}
	res, info, err := r.ScanTracked(ctx, saver, tr)
	if err != nil {
		ts.failed()
		return nil, ts, err
	}
	if info.Walked {
		e.countWalk(info.Reason)
		if info.Detail != "" {
			e.log.Debug("tracked scan walked", "sandbox", name, "reason", info.Reason, "detail", info.Detail)
		}
	} else {
		e.track.tracked.Add(1)
		e.track.paths.Add(uint64(info.Paths))
		if info.Paths == 0 {
			e.track.unchanged.Add(1)
		}
	}
	return res, ts, nil
}

func (e *Engine) countWalk(reason string) {
	e.track.mu.Lock()
	defer e.track.mu.Unlock()
	if e.track.walks == nil {
		e.track.walks = map[string]uint64{}
	}
	e.track.walks[reason]++
}

// tracker returns sandbox name's tracker, starting one (before the scan
// that it is then the base of) if there is none or it no longer marks the
// mounted root. nil: tracking could not start; the turn walks.
func (e *Engine) tracker(name string, r *overlay.Root) *overlay.Tracker {
	t := &e.track
	t.mu.Lock()
	defer t.mu.Unlock()
	if tr := t.m[name]; tr != nil {
		if tr.Watches(r) {
			return tr
		}
		t.closeLocked(name)
	}
	tr, err := r.Track(t.opts)
	if err != nil {
		t.startFails.Add(1)
		e.log.Warn("change tracking not started; turns walk", "sandbox", name, "err", err)
		return nil
	}
	if t.m == nil {
		t.m = map[string]*overlay.Tracker{}
	}
	t.m[name] = tr
	return tr
}

// untrack stops tracking sandbox name: before its root is unmounted
// (rollback, remove), which the tracker's descriptor on it would block,
// and because the next turn after any of those must walk.
func (e *Engine) untrack(name string) {
	e.track.mu.Lock()
	defer e.track.mu.Unlock()
	e.track.closeLocked(name)
}

func (t *trackers) closeLocked(name string) {
	tr := t.m[name]
	if tr == nil {
		return
	}
	s := tr.Stats()
	t.closedStats.Events += s.Events
	t.closedStats.Overflows += s.Overflows
	t.closedStats.Stale += s.Stale
	tr.Close()
	delete(t.m, name)
}

// closeTrackers stops every tracker (Engine.Close).
func (e *Engine) closeTrackers() {
	e.track.mu.Lock()
	defer e.track.mu.Unlock()
	for name := range e.track.m {
		e.track.closeLocked(name)
	}
}
