package overlay

import (
	"context"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"github.com/turnsnap/turnsnap/overlay/track"
)

// A rollback on a tracked sandbox (SetTracking) takes the live state of
// the layer from the sandbox's change tracker, as a turn does
// (docs/TRACKING.md): the tracker's base plus the paths changed since, so
// a rollback a few files away stats a few directories instead of the
// whole layer. The restored root gets a new tracker whose base is the
// restored state, so the turn (or rollback) after it is tracked too.

// rollback is one prepared rollback (rootfs.Rollback).
type rollback struct {
	b    *Backend
	name string
	root rootfs.Root
	// tracked: restore through the tracker (tracking is on and the root is
	// an overlay); else the restore walks.
	tracked bool
	ent     *trackEntry // the sandbox's tracker, detached from the backend; nil: none yet
	// reread are files mapped shared and writable, at the last turn or
	// when the rollback stopped the processes: stores through them make
	// no event, so the live scan reads them whatever their stat says.
	reread []string
}

// BeginRollback is rootfs.Rollbacker's. With tracking on it prepares a
// tracked rollback of sandbox name, before its processes are stopped: it
// detaches the sandbox's tracker (the restore closes it before it unmounts
// the root) and notes the files its running processes map shared and
// writable (mapped). Otherwise (tracking off, or the root is no overlay)
// the restore walks (and the tracker, if any, is dropped).
func (b *Backend) BeginRollback(ctx context.Context, name string, root rootfs.Root, mapped func(context.Context) ([]string, error)) rootfs.Rollback {
	rb := &rollback{b: b, name: name, root: root}
	t := &b.track
	t.mu.Lock()
	_, ok := root.(*Root)
	rb.tracked = t.on && ok
	if !rb.tracked {
		t.mu.Unlock()
		return rb
	}
	rb.ent = t.m[name]
	delete(t.m, name)
	t.mu.Unlock()
	if rb.ent != nil {
		rb.ent.saver.wait() // the restore rewrites the generation it saves into
		rb.reread = rb.ent.sharedMaps
	}
	shared, err := mapped(ctx)
	if err != nil {
		// Unknown mappings: the record cannot vouch for the files.
		t.log.Debug("rollback walks: process snapshot", "sandbox", name, "err", err)
		rb.ent = b.dropTracker(rb.ent)
		return rb
	}
	rb.reread = append(rb.reread, shared...)
	return rb
}

// Abort is rootfs.Rollback's: it drops the tracker the rollback detached.
func (rb *rollback) Abort() { rb.ent = rb.b.dropTracker(rb.ent) }

// dropTracker closes a detached tracker, counting its events; it returns
// nil.
func (b *Backend) dropTracker(ent *trackEntry) *trackEntry {
	if ent != nil {
		ent.tr.Close()
		b.foldStats(ent.tr)
	}
	return nil
}

// foldStats adds a closed tracker's counters to the backend's.
func (b *Backend) foldStats(tr *track.Tracker) {
	s := tr.Stats()
	b.track.mu.Lock()
	defer b.track.mu.Unlock()
	b.track.closedStats.Events += s.Events
	b.track.closedStats.Overflows += s.Overflows
	b.track.closedStats.Stale += s.Stale
}

// Restore is rootfs.Rollback's: it makes the sandbox's root cp's tree.
// Tracked, it restores through the tracker and installs the restored
// root's new one; Live says how the live state was found.
//
// beforeWrite runs before the root's first write (the rollback's intent
// must be durable by then); an error from it fails the restore unwritten.
func (rb *rollback) Restore(ctx context.Context, cp *delta.Checkpoint, loader delta.BlobLoader, beforeWrite func() error) (rootfs.RestoreInfo, error) {
	b, name, tree := rb.b, rb.name, cp.FSTree
	r, ok := rb.root.(*Root)
	if !ok {
		b.Untrack(name)
		if err := beforeWrite(); err != nil {
			return rootfs.RestoreInfo{}, err
		}
		return rootfs.RestoreInfo{}, rb.root.Restore(ctx, tree, loader)
	}
	if !rb.tracked {
		b.Untrack(name) // the next turn walks
		info, err := r.RestoreWith(ctx, tree, loader, RestoreOptions{BeforeWrite: beforeWrite})
		info.Live = "walk"
		return info.public(), err
	}
	b.track.mu.Lock()
	opts := b.track.opts
	b.track.mu.Unlock()
	o := RestoreOptions{Reread: rb.reread, Track: true, TrackOptions: opts, StateKey: cp.StateKey, BeforeWrite: beforeWrite}
	if rb.ent != nil {
		o.Tracker = rb.ent.tr
	}
	info, err := r.RestoreWith(ctx, tree, loader, o)
	if rb.ent != nil && info.Tracker != rb.ent.tr {
		b.foldStats(rb.ent.tr) // RestoreWith closed it
	}
	if info.Tracker != nil {
		if err != nil {
			info.Tracker.Close()
			b.foldStats(info.Tracker)
		} else {
			b.track.mu.Lock()
			if b.track.m == nil {
				b.track.m = map[string]*trackEntry{}
			}
			// Nothing runs on the root now: a restored process's mappings
			// are the next turn's snapshot's.
			b.track.m[name] = &trackEntry{tr: info.Tracker, root: r}
			b.track.mu.Unlock()
		}
	}
	return info.public(), err
}

// public is what the engine learns of a restore.
func (info RestoreInfo) public() rootfs.RestoreInfo {
	return rootfs.RestoreInfo{Live: info.Live, Fallback: info.Fallback, Mounted: info.Mounted, Verified: info.Verified}
}

// ScanRestored is rootfs.TurnScanner's: a scan of root through the change
// tracker a restore left on it (the daemon's rollback), for its receipt;
// ok is false when there is none.
func (b *Backend) ScanRestored(ctx context.Context, name string, root rootfs.Root, saver delta.BlobSaver) (*fstree.ScanResult, bool, error) {
	r, ok := root.(*Root)
	if !ok {
		return nil, false, nil
	}
	b.track.mu.Lock()
	ent := b.track.m[name]
	if !b.track.on || ent == nil || ent.root != r {
		b.track.mu.Unlock()
		return nil, false, nil
	}
	b.track.mu.Unlock()
	res, _, err := r.ScanTracked(ctx, saver, ent.tr)
	return res, true, err
}
