package overlay

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"github.com/turnsnap/turnsnap/overlay/track"
)

// Change tracking (docs/TRACKING.md). With SetTracking (the engine's
// Options.TrackChanges) a long-lived backend (the daemon's) keeps one
// track.Tracker per sandbox it has scanned for a turn, from the first turn
// until the sandbox is rolled back, removed or the backend closes. A turn
// then scans only what the kernel's change events name, and an unchanged
// turn touches nothing. Whenever the events may be incomplete the turn
// walks, never skips.

// trackers is the backend's per-sandbox change tracking.
type trackers struct {
	on   bool
	log  *slog.Logger
	opts track.Options // tests set NoDrain
	mu   sync.Mutex
	m    map[string]*trackEntry
	// beforeSave, when set (tests), runs in each background cache save
	// before it writes.
	beforeSave func()
	// counters of trackers already closed, plus the turn counters
	tracked, unchanged, paths, startFails atomic.Uint64
	closedStats                           track.Stats
	walks                                 map[string]uint64
}

// SetTracking turns change tracking on or off (the engine's
// Options.TrackChanges; tests and benchmarks switch it between turns).
// log gets its warnings.
func (b *Backend) SetTracking(on bool, log *slog.Logger) {
	if log == nil {
		log = slog.Default()
	}
	b.track.mu.Lock()
	defer b.track.mu.Unlock()
	b.track.on, b.track.log = on, log
}

// SetTrackOptions sets the options new trackers start with (tests).
func (b *Backend) SetTrackOptions(o track.Options) {
	b.track.mu.Lock()
	defer b.track.mu.Unlock()
	b.track.opts = o
}

// TrackingStats is rootfs.TurnScanner's: the change-tracking counters.
func (b *Backend) TrackingStats() rootfs.TrackingStats {
	t := &b.track
	t.mu.Lock()
	defer t.mu.Unlock()
	out := rootfs.TrackingStats{
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
// tracker afterwards (rootfs.TurnScan): done(res) once res is committed,
// skipped for a turn that committed nothing, failed otherwise (deferred: a
// no-op after either).
type turnScan struct {
	root    *Root
	ent     *trackEntry // nil: not tracked
	info    TrackedScan
	settled bool
	t       *trackers // for a tracked turn's background cache save
}

// trackEntry is one sandbox's tracker and what its lazily saved scan
// cache owes.
type trackEntry struct {
	tr   *track.Tracker
	root *Root
	// sharedMaps are the root-relative files a process mapped shared and
	// writable at the last turn: stores may have reached them since with
	// no event (and no mtime), so this turn reads them again too.
	sharedMaps []string
	// unsavedTurns and unsavedPaths count the committed tracked turns
	// whose scan cache was not written to the sandbox (saveCache).
	unsavedTurns, unsavedPaths int
	saver                      cacheSaver
}

// cacheSaver runs one tracker's scan cache saves in the background, one
// at a time. Saving the whole cache cost a tracked turn 8-21 ms at 3,000
// copied-up files and 50-96 ms at 10,000 (gob of every entry): every
// 64th 10-file turn of the big repository was one of its slowest
// (BenchmarkScaleTenFileTurns). A save writes into the root's current
// generation, so whatever replaces or removes that generation (Untrack,
// a rollback, the tracker's restart, Close) waits for the save in flight
// first (wait).
type cacheSaver struct {
	mu   sync.Mutex
	done chan struct{} // closed when the save in flight ends; nil: none started
}

// start runs save in the background unless a save is still in flight
// (false: the caller keeps its count and tries at a later turn).
func (c *cacheSaver) start(save func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		select {
		case <-c.done:
		default:
			return false
		}
	}
	done := make(chan struct{})
	c.done = done
	go func() {
		defer close(done)
		save()
	}()
	return true
}

// wait returns once no save is in flight.
func (c *cacheSaver) wait() {
	c.mu.Lock()
	done := c.done
	c.mu.Unlock()
	if done != nil {
		<-done
	}
}

// Saving the scan cache costs more than a tracked turn itself (gob of
// every entry: tens of ms at 10,000). A tracked engine keeps the current
// cache in memory and writes it after a walk, every cacheSaveTurns turns
// or cacheSavePaths changed paths (in the background: cacheSaver), and
// when tracking stops. Any committed
// cache is a valid one (files changed since it are re-read), so a crash in
// between costs re-reads, never a wrong state.
const (
	cacheSaveTurns = 64
	cacheSavePaths = 4096
)

// Committed saves res as the root's scan cache (saveCache) and makes it
// the tracker's base.
func (s *turnScan) Committed(res *fstree.ScanResult) error {
	err := s.saveCache(s.root, res)
	s.done(res)
	return err
}

// Skipped is rootfs.TurnScan's (skipped).
func (s *turnScan) Skipped(res *fstree.ScanResult, head delta.ID) { s.skipped(res, head) }

// Failed is rootfs.TurnScan's (failed).
func (s *turnScan) Failed() { s.failed() }

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
		// In the background (cacheSaver): res's cache is never changed
		// once made (later scans lay theirs over it), and any committed
		// cache is a valid one.
		t := s.t
		if s.ent.saver.start(func() {
			if t.beforeSave != nil {
				t.beforeSave()
			}
			if err := root.Committed(res); err != nil {
				t.log.Warn("scan cache not saved", "err", err) // the error names the sandbox
			}
		}) {
			s.ent.unsavedTurns, s.ent.unsavedPaths = 0, 0
		}
		return nil
	}
	if s.ent != nil {
		// A walk's cache is written now, after any older one in flight.
		s.ent.saver.wait()
		s.ent.unsavedTurns, s.ent.unsavedPaths = 0, 0
	}
	return root.Committed(res)
}

// ScanTurn is rootfs.TurnScanner's: it scans sandbox name's root for a
// checkpoint through its change tracker when tracking is on, else by
// walking. shared are the files the sandbox's processes map shared and
// writable now: such a file, now or at the last turn (unmapped since,
// after storing through it), changes without events, and once its page
// is dirty without moving its mtime: it is read again.
func (b *Backend) ScanTurn(ctx context.Context, name string, root rootfs.Root, shared []string, saver delta.BlobSaver) (*fstree.ScanResult, rootfs.TurnScan, error) {
	r, ok := root.(*Root)
	walk := func() (*fstree.ScanResult, rootfs.TurnScan, error) {
		if ok && len(shared) > 0 {
			res, err := r.ScanReread(ctx, saver, shared)
			return res, &turnScan{root: r}, err
		}
		res, err := root.Scan(ctx, saver)
		return res, plainScan{root}, err
	}
	b.track.mu.Lock()
	on := b.track.on
	b.track.mu.Unlock()
	if !on || !ok {
		return walk()
	}
	ent := b.tracker(name, r)
	if ent == nil {
		b.countWalk("start-failed")
		return walk()
	}
	ent.tr.Reread(append(shared, ent.sharedMaps...))
	ent.sharedMaps = shared
	res, info, err := r.ScanTracked(ctx, saver, ent.tr)
	ts := &turnScan{root: r, ent: ent, info: info, t: &b.track}
	if err != nil {
		ts.failed()
		return nil, ts, err
	}
	if info.Walked {
		b.countWalk(info.Reason)
		b.track.log.Debug("tracked scan walked", "sandbox", name, "reason", info.Reason, "detail", info.Detail,
			"last_loss", ent.tr.Stats().LastLoss)
	} else {
		b.track.tracked.Add(1)
		b.track.paths.Add(uint64(info.Paths))
		if info.Paths == 0 {
			b.track.unchanged.Add(1)
		}
	}
	return res, ts, nil
}

// plainScan settles the scan of a root that is none of this backend's:
// Root.Committed at once, nothing else.
type plainScan struct{ root rootfs.Root }

func (s plainScan) Committed(res *fstree.ScanResult) error { return s.root.Committed(res) }
func (plainScan) Skipped(*fstree.ScanResult, delta.ID)     {}
func (plainScan) Failed()                                  {}

func (b *Backend) countWalk(reason string) {
	b.track.mu.Lock()
	defer b.track.mu.Unlock()
	if b.track.walks == nil {
		b.track.walks = map[string]uint64{}
	}
	b.track.walks[reason]++
}

// tracker returns sandbox name's tracker, starting one (before the scan
// that it is then the base of) if there is none or it no longer marks the
// mounted root. nil: tracking could not start; the turn walks.
func (b *Backend) tracker(name string, r *Root) *trackEntry {
	t := &b.track
	t.mu.Lock()
	defer t.mu.Unlock()
	if ent := t.m[name]; ent != nil {
		if ent.tr.Watches(r.Path()) {
			return ent
		}
		b.closeLocked(name, false)
	}
	tr, err := r.Track(t.opts)
	if err != nil {
		t.startFails.Add(1)
		t.log.Warn("change tracking not started; turns walk", "sandbox", name, "err", err)
		return nil
	}
	if t.m == nil {
		t.m = map[string]*trackEntry{}
	}
	ent := &trackEntry{tr: tr, root: r}
	t.m[name] = ent
	return ent
}

// Untrack is rootfs.TurnScanner's: it stops tracking sandbox name before
// its root is unmounted (rollback, remove), which the tracker's descriptor
// on it would block, and because the next turn after any of those must
// walk. Its lazily saved scan cache is not written: the layer is about to
// be replaced.
func (b *Backend) Untrack(name string) {
	b.track.mu.Lock()
	defer b.track.mu.Unlock()
	b.closeLocked(name, false)
}

// closeLocked stops sandbox name's tracker; save writes the scan cache
// its tracked turns left unsaved.
func (b *Backend) closeLocked(name string, save bool) {
	t := &b.track
	ent := t.m[name]
	if ent == nil {
		return
	}
	ent.saver.wait() // the root's generation may go once this returns
	if base := ent.tr.Base(); save && base != nil && ent.unsavedTurns > 0 {
		if err := ent.root.Committed(base); err != nil {
			t.log.Warn("scan cache not saved", "sandbox", name, "err", err)
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

// closeTrackers stops every tracker (Close).
func (b *Backend) closeTrackers() {
	b.track.mu.Lock()
	defer b.track.mu.Unlock()
	for name := range b.track.m {
		b.closeLocked(name, true)
	}
}

// TrackerOf is sandbox name's change tracker, nil when there is none
// (tests look at its record).
func (b *Backend) TrackerOf(name string) *track.Tracker {
	b.track.mu.Lock()
	defer b.track.mu.Unlock()
	if ent := b.track.m[name]; ent != nil {
		return ent.tr
	}
	return nil
}
