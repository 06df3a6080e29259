package engine

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
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
	m    map[string]*trackEntry
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
	for _, ent := range t.m {
		s := ent.tr.Stats()
		out.Overflows += s.Overflows
		out.Events += s.Events
	}
	return out
}

// turnScan is one checkpoint's scan with what it needs to settle the
// tracker afterwards: done(res) once res is committed, skipped for a turn
// that committed nothing, failed otherwise (deferred: a no-op after
// either).
type turnScan struct {
	ent     *trackEntry // nil: not tracked
	info    overlay.TrackedScan
	settled bool
}

// trackEntry is one sandbox's tracker and what its lazily saved scan
// cache owes.
type trackEntry struct {
	tr   *overlay.Tracker
	root *overlay.Root
	// sharedMaps are the root-relative files a process mapped shared and
	// writable at the last turn: stores may have reached them since with
	// no event (and no mtime), so this turn reads them again too.
	sharedMaps []string
	// unsavedTurns and unsavedPaths count the committed tracked turns
	// whose scan cache was not written to the sandbox (saveCache).
	unsavedTurns, unsavedPaths int
}

// Saving the scan cache costs a few ms per 10,000 entries (gob), more than
// a tracked turn itself. A tracked engine keeps the current cache in
// memory and writes it after a walk, every cacheSaveTurns turns or
// cacheSavePaths changed paths, and when tracking stops. Any committed
// cache is a valid one (files changed since it are re-read), so a crash in
// between costs re-reads, never a wrong state.
const (
	cacheSaveTurns = 64
	cacheSavePaths = 4096
)

func (s *turnScan) done(res *fstree.ScanResult) {
	if s.ent != nil && !s.settled {
		s.settled = true
		s.ent.tr.Reset(res)
	}
}

// skipped settles a turn that committed nothing. Its scan becomes the
// base only if its tree is the head's own (so every tree it names is
// stored); otherwise (directory mtimes moved) it names trees that were
// never stored, and the record keeps growing from the last base.
func (s *turnScan) skipped(res *fstree.ScanResult, head delta.ID) {
	if res.Root == head {
		s.done(res)
	}
	s.settled = true
}

func (s *turnScan) failed() {
	if s.ent != nil && !s.settled {
		s.settled = true
		s.ent.tr.Lost()
	}
}

// saveCache records res as the root's committed scan (Root.Committed),
// now or, for a tracked turn, lazily.
func (s *turnScan) saveCache(root interface {
	Committed(*fstree.ScanResult) error
}, res *fstree.ScanResult) error {
	if s.ent != nil && !s.info.Walked {
		s.ent.unsavedTurns++
		s.ent.unsavedPaths += s.info.Paths
		if s.ent.unsavedTurns < cacheSaveTurns && s.ent.unsavedPaths < cacheSavePaths {
			return nil
		}
	}
	if s.ent != nil {
		s.ent.unsavedTurns, s.ent.unsavedPaths = 0, 0
	}
	return root.Committed(res)
}

// scanRoot scans sandbox name's root for a checkpoint: through its change
// tracker when tracking is on and the root is an overlay, else by walking.
func (e *Engine) scanRoot(ctx context.Context, name string, st *sandboxState, pt *procTurn, saver delta.BlobSaver) (*fstree.ScanResult, *turnScan, error) {
	// A file mapped shared and writable, now or at the last turn (unmapped
	// since, after storing through it), changes without events, and once
	// its page is dirty without moving its mtime: it is read again.
	var shared []string
	if pt.running {
		shared = sharedWritable(pt.cur)
	}
	r, ok := st.root.(*overlay.Root)
	walk := func() (*fstree.ScanResult, *turnScan, error) {
		if ok && len(shared) > 0 {
			res, err := r.ScanReread(ctx, saver, shared)
			return res, &turnScan{}, err
		}
		res, err := st.root.Scan(ctx, saver)
		return res, &turnScan{}, err
	}
	if !e.track.on || !ok {
		return walk()
	}
	ent := e.tracker(name, r)
	if ent == nil {
		e.countWalk("start-failed")
		return walk()
	}
	ent.tr.Reread(append(shared, ent.sharedMaps...))
	ent.sharedMaps = shared
	res, info, err := r.ScanTracked(ctx, saver, ent.tr)
	ts := &turnScan{ent: ent, info: info}
	if err != nil {
		ts.failed()
		return nil, ts, err
	}
	if info.Walked {
		e.countWalk(info.Reason)
		e.log.Debug("tracked scan walked", "sandbox", name, "reason", info.Reason, "detail", info.Detail,
			"last_loss", ent.tr.Stats().LastLoss)
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
func (e *Engine) tracker(name string, r *overlay.Root) *trackEntry {
	t := &e.track
	t.mu.Lock()
	defer t.mu.Unlock()
	if ent := t.m[name]; ent != nil {
		if ent.tr.Watches(r) {
			return ent
		}
		e.closeLocked(name, false)
	}
	tr, err := r.Track(t.opts)
	if err != nil {
		t.startFails.Add(1)
		e.log.Warn("change tracking not started; turns walk", "sandbox", name, "err", err)
		return nil
	}
	if t.m == nil {
		t.m = map[string]*trackEntry{}
	}
	ent := &trackEntry{tr: tr, root: r}
	t.m[name] = ent
	return ent
}

// untrack stops tracking sandbox name: before its root is unmounted
// (rollback, remove), which the tracker's descriptor on it would block,
// and because the next turn after any of those must walk. Its lazily
// saved scan cache is not written: the layer is about to be replaced.
func (e *Engine) untrack(name string) {
	e.track.mu.Lock()
	defer e.track.mu.Unlock()
	e.closeLocked(name, false)
}

// closeLocked stops sandbox name's tracker; save writes the scan cache
// its tracked turns left unsaved.
func (e *Engine) closeLocked(name string, save bool) {
	t := &e.track
	ent := t.m[name]
	if ent == nil {
		return
	}
	if base := ent.tr.Base(); save && base != nil && ent.unsavedTurns > 0 {
		if err := ent.root.Committed(base); err != nil {
			e.log.Warn("scan cache not saved", "sandbox", name, "err", err)
		}
	}
	tr := ent.tr
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
		e.closeLocked(name, true)
	}
}
