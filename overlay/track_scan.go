package overlay

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"github.com/turnsnap/turnsnap/overlay/track"
	"golang.org/x/sys/unix"
)

// TrackedScan says how Root.ScanTracked decided.
type TrackedScan struct {
	// Walked is set when the full incremental walk ran; Reason says why
	// (track.ReasonStart, track.ReasonOverflow ...).
	Walked bool
	Reason string
	// Paths is how many changed paths the events named.
	Paths int
	// Detail is what made a tracked scan walk (for logs).
	Detail string
}

// ScanTracked is Scan driven by t's record: with no change since t's base
// (the last scan passed to Reset) it returns that scan's result without
// touching the layer; with changes it reads only the paths the events
// name (fstree.ScanChanged); when the record is unknown, or the changed
// paths are ambiguous, it walks like Scan. The result equals Scan's, state
// key for state key. Pass it to t.Reset once the checkpoint holding it is
// committed, and only then: the directories it takes whole name trees by
// id, which must be stored. A skipped turn leaves the record as it is (it
// keeps growing from the last committed scan); a failed one calls t.Lost.
func (r *Root) ScanTracked(ctx context.Context, saver delta.BlobSaver, t *track.Tracker) (*fstree.ScanResult, TrackedScan, error) {
	g, err := r.gen()
	if err != nil {
		return nil, TrackedScan{}, err
	}
	// Linking up first: the names it adds make events, which belong in
	// the record this scan takes.
	if err := r.linkUp(g); err != nil {
		return nil, TrackedScan{}, fmt.Errorf("sandbox %s: %w", r.dir, err)
	}
	paths, why := t.Changes()
	if !t.Watches(r.Path()) {
		why = track.ReasonRemount
	}
	if why == "" && !r.trackable(g) {
		why = track.ReasonLayout
	}
	base := t.Base()
	if why == "" && base == nil {
		why = track.ReasonStart
	}
	info := TrackedScan{Paths: len(paths)}
	reread := t.RereadSet()
	if why == "" && len(paths) == 0 {
		return &fstree.ScanResult{Root: base.Root, StateKey: base.StateKey, Cache: base.Cache}, info, nil
	}
	upper := filepath.Join(g, "upper")
	if why == "" {
		res, err := r.scanChanged(ctx, upper, saver, base.Cache, fstree.NewChangeSet(paths), reread)
		if err == nil {
			return res, info, nil
		}
		if !errors.Is(err, fstree.ErrMustWalk) {
			return nil, info, err
		}
		why, info.Detail = track.ReasonHardlink, err.Error()
	}
	info.Walked, info.Reason = true, why
	// The walk builds on the newest committed cache: the record's base if
	// it has one (the file may be older, see track.Tracker.Base), else the file.
	var prev *fstree.ScanCache
	if base != nil {
		prev = base.Cache
	}
	res, err := r.walkLayer(ctx, g, saver, prev, reread)
	return res, info, err
}

// trackable reports whether generation g is a layout a tracked scan
// understands: one upper over the base, scanned as Scan scans it.
func (r *Root) trackable(g string) bool {
	// A stacked root's upper is relative to its frozen layer: its scans
	// compose onto that layer's tree (stack.go), which the changed-path
	// scan does not; it walks.
	s, err := readStack(g)
	return err == nil && s == nil
}

// walkLayer is what Scan does after linkUp, with prev (nil: the cache
// file) and reread passed through. Keep it Scan's twin: a tracked root
// that walks must get exactly Scan's result.
func (r *Root) walkLayer(ctx context.Context, g string, saver delta.BlobSaver, prev *fstree.ScanCache, reread map[string]bool) (*fstree.ScanResult, error) {
	if prev == nil {
		prev = r.memo.read(filepath.Join(g, "scan.cache"))
	}
	if s, err := readStack(g); err != nil || s != nil {
		if err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", r.dir, err)
		}
		return r.scanStacked(ctx, g, s, saver, prev, reread)
	}
	return r.scanUpper(ctx, filepath.Join(g, "upper"), saver, prev, fstree.ScanOptions{Reread: reread})
}

// scanChanged is scanUpper for a tracked scan. A tracked scan gives up
// (ErrMustWalk) at any multiply-linked file, so the second pass that
// matches hardlinks across renamed directories is never needed.
func (r *Root) scanChanged(ctx context.Context, upper string, saver delta.BlobSaver, prev *fstree.ScanCache, changed *fstree.ChangeSet, reread map[string]bool) (*fstree.ScanResult, error) {
	u, err := r.newUpperScan()
	if err != nil {
		return nil, err
	}
	defer u.close()
	opts := fstree.ScanOptions{IDs: r.ids, Translate: Translate, Residue: u.residue, Redirect: u.redirect, Reread: reread}
	index, err := fsat.OpenDir(filepath.Join(filepath.Dir(upper), "work", "index"))
	if err == nil {
		defer unix.Close(index)
		opts.TreeLinks = u.treeLinks(index)
	} else if !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("sandbox %s: index dir: %w", r.dir, err)
	}
	var trees *treeBuffer
	if saver != nil {
		trees = &treeBuffer{next: saver}
		opts.Saver = trees
	}
	res, err := fstree.ScanChanged(ctx, upper, prev, changed, opts)
	if err == nil && trees != nil {
		err = trees.flush(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", r.dir, err)
	}
	return res, nil
}

// treeLinks counts the names of a multiply-linked upper file that are in
// the layer: with index=on,nfs_export=on every copied-up file is also
// linked into the workdir's index, under the hex of its origin record, and
// that link is no name of the sandbox's.
func (u *upperScan) treeLinks(indexFD int) func(dirFD int, name, rel string, st *unix.Stat_t) (uint64, error) {
	return func(dirFD int, name, rel string, st *unix.Stat_t) (uint64, error) {
		n, err := unix.Lgetxattr(fsat.ProcPath(dirFD, name), originXattr, u.xbuf)
		if errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOTSUP) {
			return uint64(st.Nlink), nil
		}
		if err != nil {
			return 0, fmt.Errorf("read origin: %w", err)
		}
		var ist unix.Stat_t
		if unix.Fstatat(indexFD, hex.EncodeToString(u.xbuf[:n]), &ist, unix.AT_SYMLINK_NOFOLLOW) == nil &&
			ist.Dev == st.Dev && ist.Ino == st.Ino {
			return uint64(st.Nlink) - 1, nil
		}
		return uint64(st.Nlink), nil
	}
}

// ScanFull reads the whole upper layer with no cache: the oracle a tracked
// or incremental scan must equal. Nothing is saved.
func (r *Root) ScanFull(ctx context.Context) (*fstree.ScanResult, error) {
	g, err := r.gen()
	if err != nil {
		return nil, err
	}
	return r.scanUpper(ctx, filepath.Join(g, "upper"), nil, nil, fstree.ScanOptions{})
}

// ScanReread is Scan that reads the files named by reread (root-relative)
// whatever the cache says: files a process maps shared and writable, whose
// stores need not move their stat.
func (r *Root) ScanReread(ctx context.Context, saver delta.BlobSaver, reread []string) (*fstree.ScanResult, error) {
	g, err := r.gen()
	if err != nil {
		return nil, err
	}
	if err := r.linkUp(g); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", r.dir, err)
	}
	set := make(map[string]bool, len(reread))
	for _, p := range reread {
		set[p] = true
	}
	return r.walkLayer(ctx, g, saver, nil, set)
}

// Track starts recording changes to the mounted root r (track.Start).
func (r *Root) Track(opts track.Options) (*track.Tracker, error) {
	return track.Start(r.dir, r.Path(), opts)
}
