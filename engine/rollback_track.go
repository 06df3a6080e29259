package engine

import (
	"context"
	"path"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"github.com/turnsnap/turnsnap/overlay"
	"github.com/turnsnap/turnsnap/proc"
)

// A rollback on a tracked overlay sandbox (Options.TrackChanges) takes
// the live state of the layer from the sandbox's change tracker, as a
// turn does (docs/TRACKING.md): the tracker's base plus the paths changed
// since, so a rollback a few files away stats a few directories instead
// of the whole layer. The restored root gets a new tracker whose base is
// the restored state, so the turn (or rollback) after it is tracked too.

// rollbackTrack is what a tracked rollback hands the overlay restore.
type rollbackTrack struct {
	ent *trackEntry // the sandbox's tracker, detached from the engine; nil: none yet
	// reread are files mapped shared and writable, at the last turn or
	// when the rollback stopped the processes: stores through them make
	// no event, so the live scan reads them whatever their stat says.
	reread []string
}

// sharedWritable is the root-relative paths of the files ps maps shared
// and writable (a deleted file is no name of the root).
func sharedWritable(ps proc.ProcSet) []string {
	var out []string
	for _, p := range ps.SharedWritable() {
		if rel := strings.TrimPrefix(path.Clean(p), "/"); rel != "" && !strings.HasSuffix(p, " (deleted)") {
			out = append(out, rel)
		}
	}
	return out
}

// trackRollback prepares a tracked rollback of sandbox name, before its
// processes are stopped: it detaches the sandbox's tracker (the restore
// closes it before it unmounts the root) and notes the files its running
// processes map shared and writable. nil: tracking is off or the root is
// no overlay; the restore walks (and the tracker, if any, is dropped).
func (e *Engine) trackRollback(ctx context.Context, name string, root rootfs.Root) *rollbackTrack {
	if _, ok := root.(*overlay.Root); !e.track.on || !ok {
		return nil
	}
	t := &e.track
	t.mu.Lock()
	rt := &rollbackTrack{ent: t.m[name]}
	delete(t.m, name)
	t.mu.Unlock()
	if rt.ent != nil {
		rt.reread = rt.ent.sharedMaps
	}
	running, err := e.containerRunning(ctx, name)
	if err != nil {
		rt.ent = e.dropTracker(rt.ent)
		return rt
	}
	if running {
		r, _ := e.runtime(ctx)
		ps, err := r.Snapshot(ctx, e.home.containerID(name))
		if err != nil {
			// Unknown mappings: the record cannot vouch for the files.
			e.log.Debug("rollback walks: process snapshot", "sandbox", name, "err", err)
			rt.ent = e.dropTracker(rt.ent)
			return rt
		}
		rt.reread = append(rt.reread, sharedWritable(ps)...)
	}
	return rt
}

// detached is the tracker rt holds, for a rollback that stops before its
// restore.
func (rt *rollbackTrack) detached() *trackEntry {
	if rt == nil {
		return nil
	}
	return rt.ent
}

// dropTracker closes a detached tracker, counting its events; it returns
// nil.
func (e *Engine) dropTracker(ent *trackEntry) *trackEntry {
	if ent != nil {
		ent.tr.Close()
		e.foldStats(ent.tr)
	}
	return nil
}

// foldStats adds a closed tracker's counters to the engine's.
func (e *Engine) foldStats(tr *overlay.Tracker) {
	s := tr.Stats()
	e.track.mu.Lock()
	defer e.track.mu.Unlock()
	e.track.closedStats.Events += s.Events
	e.track.closedStats.Overflows += s.Overflows
	e.track.closedStats.Stale += s.Stale
}

// restoreRoot makes the sandbox's root tree for a rollback. With rt it
// restores through the tracker and installs the restored root's new one;
// it returns how the overlay restore went (its Live says how the live
// state was found; zero when not an overlay).
//
// beforeWrite runs before the root's first write (the rollback's intent
// must be durable by then); an error from it fails the restore unwritten.
func (e *Engine) restoreRoot(ctx context.Context, name string, root rootfs.Root, cp *delta.Checkpoint, loader delta.BlobLoader, rt *rollbackTrack, beforeWrite func() error) (overlay.RestoreInfo, error) {
	tree := cp.FSTree
	r, ok := root.(*overlay.Root)
	if !ok {
		e.untrack(name)
		if err := beforeWrite(); err != nil {
			return overlay.RestoreInfo{}, err
		}
		return overlay.RestoreInfo{}, root.Restore(ctx, tree, loader)
	}
	if rt == nil {
		e.untrack(name) // the next turn walks
		info, err := r.RestoreWith(ctx, tree, loader, overlay.RestoreOptions{BeforeWrite: beforeWrite})
		info.Live = "walk"
		return info, err
	}
	o := overlay.RestoreOptions{Reread: rt.reread, Track: true, TrackOptions: e.track.opts, StateKey: cp.StateKey, BeforeWrite: beforeWrite}
	if rt.ent != nil {
		o.Tracker = rt.ent.tr
	}
	info, err := r.RestoreWith(ctx, tree, loader, o)
	if rt.ent != nil && info.Tracker != rt.ent.tr {
		e.foldStats(rt.ent.tr) // RestoreWith closed it
	}
	if info.Tracker != nil {
		if err != nil {
			info.Tracker.Close()
			e.foldStats(info.Tracker)
		} else {
			e.track.mu.Lock()
			if e.track.m == nil {
				e.track.m = map[string]*trackEntry{}
			}
			// Nothing runs on the root now: a restored process's mappings
			// are the next turn's snapshot's.
			e.track.m[name] = &trackEntry{tr: info.Tracker, root: r}
			e.track.mu.Unlock()
		}
	}
	return info, err
}

// stateMemoMax bounds the memo; past it an arbitrary entry goes.
const stateMemoMax = 1024

// checkState is delta.CheckState of tree through l (rules: a layer's),
// from the memo when tree passed before.
func (e *Engine) checkState(ctx context.Context, l *fstree.CheckedLoader, tree delta.ID) (delta.Footprint, error) {
	m := &e.checked
	m.mu.Lock()
	fp, ok := m.m[tree]
	m.mu.Unlock()
	if ok {
		l.Checked(tree, delta.StateRules{})
		return fp, nil
	}
	fp, err := l.CheckState(ctx, tree, delta.StateRules{})
	if err != nil {
		return fp, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[delta.ID]delta.Footprint{}
	}
	if len(m.m) >= stateMemoMax {
		for k := range m.m {
			delete(m.m, k)
			break
		}
	}
	m.m[tree] = fp
	return fp, nil
}
