package overlay

import (
	"context"
	"errors"
	"fmt"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"github.com/turnsnap/turnsnap/overlay/track"
	"golang.org/x/sys/unix"
)

// A restore by diff needs the live state of the layer. Without help that
// is a walk: one stat per entry of the layer, however few names differ.
// With the engine's change tracker (docs/TRACKING.md) it is the tracker's
// base (the last committed scan) plus the paths the kernel saw change
// since, scanned with fstree.ScanChanged: a rollback a few files away stats
// a few directories. Whenever the record may be incomplete the layer is
// walked, as without a tracker.

// RestoreOptions configures RestoreWith.
type RestoreOptions struct {
	// Tracker, if set, is the root's change tracker: when its record is
	// whole, the live state comes from it instead of a walk. RestoreWith
	// closes it (its descriptor would keep the root from unmounting),
	// unless it hands it back in RestoreInfo.Tracker.
	Tracker *track.Tracker
	// Reread names root-relative files the live scan reads whatever
	// their stat says: files a process mapped shared and writable, whose
	// stores make no event and need not move their stat.
	Reread []string
	// Track starts tracking the restored root: RestoreInfo.Tracker is a
	// tracker whose base is the restored state, so the next turn (or
	// rollback) is tracked too. Only a restore by diff does.
	Track        bool
	TrackOptions track.Options
	// StateKey is the target's state key (its checkpoint's), for the new
	// tracker's base. Zero: the new tracker has no base (its first turn
	// walks).
	StateKey delta.ID
	// BeforeWrite, if set, runs once before anything of the root is
	// changed (the unmount, the first write, a rebuild), and not at all
	// when nothing is; an error from it fails the restore with the root
	// untouched. The engine makes its rollback intent durable there, so
	// the intent's fsyncs overlap the live scan and the plan.
	BeforeWrite func() error
}

// RestoreInfo says how RestoreWith went.
type RestoreInfo struct {
	// Live is how the live state was found: "tracked", "walk" (no
	// tracker), or the reason a tracker's record could not be used (the
	// Reason* names).
	Live string
	// Fallback is why the layer was rebuilt whole ("": restored by diff).
	Fallback string
	// Tracker is the tracker of the restored root (RestoreOptions.Track):
	// nil if none could start. It is the caller's to close.
	Tracker *track.Tracker
	// Mounted says the diff was written through the mounted root, which
	// stayed mounted (fstree.DiffPlan.Mountable).
	Mounted bool
	// Verified is the layer tree the restore proved the layer holds (the
	// diff read back every name it wrote and listed every directory it
	// changed; a rebuild re-hashed the whole layer): the tree asked for,
	// on success. Zero: nothing proved.
	Verified delta.ID
}

// LiveTracked is RestoreInfo.Live for a live state taken from a tracker.
const LiveTracked = "tracked"

// liveState scans the live upper for a restore: from o.Tracker's record
// when it is whole, else by the incremental walk. The trees it made are
// kept in memory; the trees a tracked scan took whole from its base are
// stored, and are read from loader.
func (r *Root) liveState(ctx context.Context, upper, cacheFile string, loader delta.BlobLoader, o RestoreOptions, info *RestoreInfo) (*fstree.ScanResult, delta.BlobLoader, error) {
	reread := map[string]bool{}
	for _, p := range o.Reread {
		reread[p] = true
	}
	info.Live = "walk"
	var prev *fstree.ScanCache
	if t := o.Tracker; t != nil {
		paths, why := t.Changes()
		if why == "" && !t.Watches(r.Path()) {
			why = track.ReasonRemount
		}
		base := t.Base()
		if why == "" && base == nil {
			why = track.ReasonStart
		}
		for p := range t.RereadSet() {
			reread[p] = true
		}
		if why == "" {
			trees := memTrees{}
			res, err := r.scanChanged(ctx, upper, trees, base.Cache, fstree.NewChangeSet(paths), reread)
			if err == nil {
				info.Live = LiveTracked
				return res, storedTrees{mem: trees, stored: loader}, nil
			}
			// A scan that cannot decide, or fails, leaves it to the walk.
			why = "scan-failed"
			if errors.Is(err, fstree.ErrMustWalk) {
				why = track.ReasonHardlink
			}
		}
		info.Live = why
		if base != nil {
			prev = base.Cache // newer than the file (track.Tracker.Base)
		}
	}
	if prev == nil {
		prev = r.memo.read(cacheFile)
	}
	trees := memTrees{}
	live, redirected, err := r.scanUpperR(ctx, upper, trees, prev, fstree.ScanOptions{Reread: reread})
	if err != nil {
		return nil, nil, &fallback{"the live layer does not scan: " + err.Error()}
	}
	if redirected {
		return nil, nil, &fallback{"the layer holds a renamed base directory"}
	}
	return live, trees, nil
}

// storedTrees serves a tracked scan's trees: the ones it made from memory,
// the ones it took whole from its base (committed, so stored) from the
// store.
type storedTrees struct {
	mem    memTrees
	stored delta.BlobLoader
}

func (s storedTrees) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	if data, ok := s.mem[id]; ok && t == delta.BlobTree {
		return data, nil
	}
	if t != delta.BlobTree {
		return nil, fmt.Errorf("live state: %s %s is not a tree", t, id.Short())
	}
	return s.stored.LoadBlob(ctx, t, id)
}

// notRedirected refuses a restore by diff into a renamed base directory
// (PlanDiff's KeptDir). Its upper holds only what changed below it, while
// its tree holds its merged contents and is marked opaque: a diff planned
// from the tree would remove names the upper never had and mark the
// upper opaque, hiding the lower. A walk of the layer finds any such
// directory; a tracked scan does not look into directories it takes
// whole, so the plan checks each directory it changes.
func notRedirected(dirFD int, name, rel string, buf []byte) error {
	_, err := unix.Lgetxattr(fsat.ProcPath(dirFD, name), RedirectXattr, buf)
	switch {
	case err == nil:
		return fmt.Errorf("/%s is a renamed base directory: %w", rel, fstree.ErrDiffUnsupported)
	case errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOTSUP):
		return nil
	}
	return fmt.Errorf("read redirect: %w", err)
}

// retrack starts a tracker on the restored (mounted) root and gives it
// the restored state as its base: the target tree, its state key, and the
// scan cache of the restore (the live scan's, patched with what Verify
// read back). Verify proved the layer is the target, so every tree the
// base names is stored; the cache is valid for the same reason it is
// valid on disk (restoreDiff). Directories the diff changed carry no
// state key in it (Verify reads them shallow), so the next scan lists
// them again. The tracker is started after the mount and before anything
// can run on the root, so its record misses nothing. Without a state key
// the tracker has no base: its first turn walks.
func (r *Root) retrack(tree, stateKey delta.ID, cache *fstree.ScanCache, o RestoreOptions, info *RestoreInfo) {
	t, err := r.Track(o.TrackOptions)
	if err != nil {
		return // the next turn starts one, and walks
	}
	if stateKey != (delta.ID{}) {
		t.Reset(&fstree.ScanResult{Root: tree, StateKey: stateKey, Cache: cache})
	}
	info.Tracker = t
}

// rebase makes the restored state the base of t, a tracker that watched
// the restore; without a state key t loses its base (Lost), so its next
// turn walks.
func rebase(t *track.Tracker, tree, stateKey delta.ID, cache *fstree.ScanCache) {
	if stateKey == (delta.ID{}) {
		t.Lost()
		return
	}
	t.Reset(&fstree.ScanResult{Root: tree, StateKey: stateKey, Cache: cache})
}

// mountable says whether plan can be applied through the mounted root
// (fstree.DiffPlan.Mountable): every name it touches is absent from the
// base, or one whose write through the mount is exact (a base file
// brought back as a copy, fstree's diffbase.go). A stacked root never gets
// here (restoreDiff rebuilds it), so the base is the only lower layer.
func (r *Root) mountable(ctx context.Context, plan *fstree.DiffPlan) (bool, error) {
	why, err := plan.Mountable(ctx, r.lower)
	if err != nil || why != "" {
		return false, err
	}
	return true, nil
}
