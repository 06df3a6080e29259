package overlay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// A restore by diff needs the live state of the layer. Without help that
// is a walk: one stat per entry of the layer, however few names differ.
// With the engine's change tracker (docs/TRACKING.md) it is the tracker's
// base (the last committed scan) plus the paths the kernel saw change
// since, scanned with delta.ScanChanged: a rollback a few files away stats
// a few directories. Whenever the record may be incomplete the layer is
// walked, as without a tracker.

// RestoreOptions configures RestoreWith.
type RestoreOptions struct {
	// Tracker, if set, is the root's change tracker: when its record is
	// whole, the live state comes from it instead of a walk. RestoreWith
	// closes it (its descriptor would keep the root from unmounting),
	// unless it hands it back in RestoreInfo.Tracker.
	Tracker *Tracker
	// Reread names root-relative files the live scan reads whatever
	// their stat says: files a process mapped shared and writable, whose
	// stores make no event and need not move their stat.
	Reread []string
	// Track starts tracking the restored root: RestoreInfo.Tracker is a
	// tracker whose base is the restored state, so the next turn (or
	// rollback) is tracked too. Only a restore by diff does.
	Track        bool
	TrackOptions TrackOptions
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
	Tracker *Tracker
}

// LiveTracked is RestoreInfo.Live for a live state taken from a tracker.
const LiveTracked = "tracked"

// liveState scans the live upper for a restore: from o.Tracker's record
// when it is whole, else by the incremental walk. The trees it made are
// kept in memory; the trees a tracked scan took whole from its base are
// stored, and are read from loader.
func (r *Root) liveState(ctx context.Context, upper, cacheFile string, loader delta.BlobLoader, o RestoreOptions, info *RestoreInfo) (*delta.ScanResult, delta.BlobLoader, error) {
	reread := map[string]bool{}
	for _, p := range o.Reread {
		reread[p] = true
	}
	info.Live = "walk"
	var prev *delta.ScanCache
	if t := o.Tracker; t != nil {
		paths, why := t.Changes()
		if why == "" && !t.Watches(r) {
			why = ReasonRemount
		}
		base := t.base()
		if why == "" && base == nil {
			why = ReasonStart
		}
		for p := range t.rereadSet() {
			reread[p] = true
		}
		if why == "" {
			trees := memTrees{}
			res, err := r.scanChanged(ctx, upper, trees, base.Cache, delta.NewChangeSet(paths), reread)
			if err == nil {
				info.Live = LiveTracked
				return res, storedTrees{mem: trees, stored: loader}, nil
			}
			// A scan that cannot decide, or fails, leaves it to the walk.
			why = "scan-failed"
			if errors.Is(err, delta.ErrMustWalk) {
				why = ReasonHardlink
			}
		}
		info.Live = why
		if base != nil {
			prev = base.Cache // newer than the file (Tracker.Base)
		}
	}
	if prev == nil {
		prev = r.memo.read(cacheFile)
	}
	trees := memTrees{}
	live, redirected, err := r.scanUpperR(ctx, upper, trees, prev, delta.ScanOptions{Reread: reread})
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
		return fmt.Errorf("/%s is a renamed base directory: %w", rel, delta.ErrDiffUnsupported)
	case errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOTSUP):
		return nil
	}
	return fmt.Errorf("read redirect: %w", err)
}

// retrack starts a tracker on the restored (mounted) root and gives it
// the restored state as its base: a scan of the names the diff wrote on
// top of the live scan's cache, which must come out as the target tree
// (so every tree it names is stored). The tracker is started first, so a
// change after the scan's reads is in its record. A scan that cannot
// decide (a hardlinked file) leaves the tracker without a base: its first
// turn walks.
func (r *Root) retrack(ctx context.Context, upper string, tree delta.ID, prev *delta.ScanCache, res *delta.DiffResult, o RestoreOptions, info *RestoreInfo) error {
	t, err := r.Track(o.TrackOptions)
	if err != nil {
		return nil // the next turn starts one, and walks
	}
	post, err := r.scanChanged(ctx, upper, nil, prev, delta.NewChangeSet(diffLeaves(res)), nil)
	switch {
	case errors.Is(err, delta.ErrMustWalk):
	case err != nil:
		t.Close()
		return err
	case post.Root != tree:
		t.Close()
		return &fallback{fmt.Sprintf("the restored layer scans as tree %s, not %s", post.Root.Short(), tree.Short())}
	default:
		t.Reset(post)
	}
	info.Tracker = t
	return nil
}

// diffLeaves is the paths a diff wrote or removed less those that are only
// the directories above others: a directory on the way to a changed path
// is listed by the scan anyway, while a named one is re-read whole (the
// root's name would make the scan a walk).
func diffLeaves(res *delta.DiffResult) []string {
	paths := append(append([]string(nil), res.Removed...), res.Written...)
	slices.Sort(paths)
	paths = slices.Compact(paths)
	out := paths[:0]
	for i, p := range paths {
		// Sorted, a path's descendants follow it, after any siblings that
		// sort between ("a" < "a-b" < "a/c"): look at the first path
		// at or after p+"/".
		j, _ := slices.BinarySearch(paths[i+1:], p+"/")
		next := i + 1 + j
		above := p == "" && len(paths) > 1 ||
			p != "" && next < len(paths) && strings.HasPrefix(paths[next], p+"/")
		if !above {
			out = append(out, p)
		}
	}
	return out
}
