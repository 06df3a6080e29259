package overlay

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"golang.org/x/sys/unix"
)

// Restore makes the writable layer exactly tree, rewriting only what
// differs from the live layer (fstree.PlanDiff): files in both states keep
// their inodes, and a rollback a few files away costs a few files.
//
//  1. The live upper is scanned (incrementally, from the scan cache) with
//     the root still mounted; its trees are kept in memory.
//  2. The diff is planned: the target checked, every chunk it needs loaded
//     and verified, room checked. A failure here changes nothing.
//  3. The root is unmounted (the engine has stopped the sandbox's
//     processes), the diff applied to the upper, and every name written is
//     read back (DiffPlan.Verify explains why that suffices). Index entries
//     of removed copied-up files are dropped as each is removed, and the
//     root is mounted again. A diff that touches only names the base
//     lacks (fstree.DiffPlan.Mountable) is instead written through the
//     mounted root, which stays mounted, and read back from the upper the
//     same way; a tracker on it stays, with the restored state its base.
//
// It falls back to rebuilding the whole layer beside the live one (the
// old path: new inodes) for a layer with a renamed base directory (overlay
// redirects), one that does not mount, a diff over the memory bound or
// touching a multiply-linked file, and a verify mismatch. An error after
// the first write wraps fstree.ErrPartial: the layer is a mix, and running
// Restore again (the engine's rollback intent) finishes it.
func (r *Root) Restore(ctx context.Context, tree delta.ID, loader delta.BlobLoader) error {
	_, err := r.RestoreWith(ctx, tree, loader, RestoreOptions{})
	return err
}

// RestoreWith is Restore with a change tracker (restore_track.go): the
// live state is found from the tracker's record instead of a walk, and a
// new tracker can be started on the restored root.
func (r *Root) RestoreWith(ctx context.Context, tree delta.ID, loader delta.BlobLoader, o RestoreOptions) (RestoreInfo, error) {
	var info RestoreInfo
	r.lastFallback = ""
	// BeforeWrite runs once, before the first change of the root.
	before := o.BeforeWrite
	o.BeforeWrite = func() error {
		if before == nil {
			return nil
		}
		f := before
		before = nil
		return f()
	}
	if r.rebuildAll != nil && r.rebuildAll.Load() {
		if o.Tracker != nil {
			o.Tracker.Close() // its descriptor would keep the root from unmounting
		}
		info.Fallback = "rebuild asked for (Backend.SetRebuildRestores)"
		if err := o.BeforeWrite(); err != nil {
			return info, err
		}
		if err := r.rebuild(ctx, tree, loader); err != nil {
			return info, err
		}
		info.Verified = tree // rebuild re-hashed it
		return info, nil
	}
	written, err := r.restoreDiff(ctx, tree, loader, o, &info)
	var fb *fallback
	if !errors.As(err, &fb) {
		return info, err
	}
	r.lastFallback, info.Fallback = fb.why, fb.why
	if err := o.BeforeWrite(); err != nil {
		return info, err
	}
	if err := r.rebuild(ctx, tree, loader); err != nil {
		if written {
			return info, fmt.Errorf("%w: %w", fstree.ErrPartial, err)
		}
		return info, err
	}
	info.Verified = tree // rebuild re-hashed it
	return info, nil
}

// A diff restore that wrote more than this rewrites the scan cache file;
// a smaller one leaves re-reading its files to another process's next
// scan (restoreDiff).
const (
	cacheWriteFiles = 64
	cacheWriteBytes = 8 << 20
)

// fallback is restoreDiff's answer for a layer it leaves to rebuild.
type fallback struct{ why string }

func (f *fallback) Error() string { return "restore by rebuild: " + f.why }

// restoreDiff is Restore's diff path; written says whether it changed the
// layer before it failed. It always closes o.Tracker, unless it hands it
// back in info.Tracker.
func (r *Root) restoreDiff(ctx context.Context, tree delta.ID, loader delta.BlobLoader, o RestoreOptions, info *RestoreInfo) (bool, error) {
	t := o.Tracker
	defer func() {
		if t != nil && t != info.Tracker {
			t.Close()
		}
	}()
	if err := r.Mount(ctx); err != nil {
		return false, &fallback{"the live layer does not mount: " + err.Error()}
	}
	g, err := r.gen()
	if err != nil {
		return false, err
	}
	// A stacked generation's upper is relative to its frozen layer, not to
	// the base the diff is planned against: rebuild a plain layer (which
	// also unstacks the root).
	if s, err := readStack(g); err != nil || s != nil {
		return false, &fallback{"the root is stacked on a frozen layer"}
	}
	// Linking up first: the names it adds make events, which belong in
	// the record the live scan takes.
	if err := r.linkUp(g); err != nil {
		return false, &fallback{"linking up base hardlinks: " + err.Error()}
	}
	upper, cacheFile := filepath.Join(g, "upper"), filepath.Join(g, "scan.cache")
	live, trees, err := r.liveState(ctx, upper, cacheFile, loader, o, info)
	if err != nil {
		return false, err
	}
	index := filepath.Join(g, "work", "index")
	xbuf := make([]byte, fsat.XattrBufSize)
	u, err := r.newUpperScan() // residue, for the restored state keys
	if err != nil {
		return false, err
	}
	defer u.close()
	plan, err := fstree.PlanDiff(ctx, upper, live.Root, tree, fstree.DiffOptions{IDs: r.ids,
		Loader: loader, Live: trees, Translate: Translate, LiveCache: live.Cache, Residue: u.residue,
		Names: func(dirFD int, name string, st *unix.Stat_t) (uint64, error) {
			return indexedNames(index, dirFD, name, st, xbuf)
		},
		Removing: func(dirFD int, name, _ string) error { return dropIndex(index, dirFD, name, xbuf) },
		KeptDir:  func(dirFD int, name, rel string) error { return notRedirected(dirFD, name, rel, xbuf) },
		Phase:    func() { rootfs.Phase(ctx, "rollback: layer-rewrite") },
	})
	if errors.Is(err, fstree.ErrDiffUnsupported) {
		return false, &fallback{err.Error()}
	}
	if err != nil {
		return false, fmt.Errorf("sandbox %s: %w", r.dir, err)
	}
	if plan.Empty() {
		// The root is the target already and stays mounted: the tracker
		// keeps watching it, and the scan that found it is its base (it
		// names only the target's trees, which are stored).
		if t != nil && o.Track && live.Root == tree {
			t.Reset(live)
			info.Tracker = t
		}
		info.Verified = tree // the live scan found nothing to change
		return false, nil
	}
	mounted, err := r.mountable(ctx, plan)
	if err != nil {
		return false, fmt.Errorf("sandbox %s: %w", r.dir, err)
	}
	if err := o.BeforeWrite(); err != nil {
		return false, err
	}
	var res *fstree.DiffResult
	if mounted {
		info.Mounted = true
		end := func() {}
		if t != nil {
			end = t.Quiet(os.Getpid())
		}
		res, err = plan.ApplyMounted(ctx, r.Path())
		end()
		if err != nil {
			return errors.Is(err, fstree.ErrPartial), fmt.Errorf("sandbox %s: %w", r.dir, err)
		}
	} else {
		if t != nil {
			t.Close() // its descriptor on the mount would make the unmount fail
			t = nil
		}
		if err := r.Unmount(ctx); err != nil {
			return false, err
		}
		res, err = plan.Apply(ctx)
		if err != nil {
			partial := errors.Is(err, fstree.ErrPartial)
			if merr := r.Mount(ctx); merr != nil {
				err = errors.Join(err, merr)
			}
			return partial, fmt.Errorf("sandbox %s: %w", r.dir, err)
		}
	}
	fresh, err := plan.Verify(ctx, res)
	if err != nil {
		return true, &fallback{err.Error()}
	}
	if err := plan.Sync(res, fresh); err != nil {
		return true, fmt.Errorf("%w: sandbox %s: %w", fstree.ErrPartial, r.dir, err)
	}
	// The new cache is the live scan's, patched where the diff wrote, so the
	// first checkpoint after the restore reads nothing it does not have to.
	// A cache must name only stored chunks (Committed): every entry kept
	// is one the diff left alone, so equal to the target's, and every entry
	// Verify read is the target's, so all of them are the checkpoint's.
	//
	// The old cache file stays valid too (keyed by ctime, it only misses
	// on what the diff wrote). Encoding a 2,000-entry cache costs more than
	// re-reading a few files, so a small diff only hands the patched cache
	// to the backend's memo (this process's next turn reads nothing; another
	// process's re-reads the few files), and a large one writes it.
	cache := patchCache(live.Cache, res.Removed, fresh)
	if res.Stats.Files > cacheWriteFiles || res.Stats.Bytes > cacheWriteBytes || r.memo == nil {
		if writeCacheFile(cacheFile, func(w *bufio.Writer) error { return fstree.WriteCache(w, cache) }) == nil {
			r.memo.wrote(cacheFile, cache)
		}
	} else {
		r.memo.wrote(cacheFile, cache)
	}
	if !mounted {
		if err := r.Mount(ctx); err != nil {
			return true, &fallback{"the restored layer does not mount: " + err.Error()}
		}
	}
	info.Verified = tree // Verify read back what the diff wrote
	if o.Track {
		// The state key Verify computed must be the checkpoint's: a
		// mismatch (a checkpoint another backend took) or an unknown one
		// leaves the new tracker without a base.
		key, ok := plan.StateKey()
		if !ok || key != o.StateKey {
			key = delta.ID{}
		}
		if t != nil {
			// Still on the mount it marked: the restored state is its new
			// base. The events of the diff's own writes stay in its record
			// (they came after Changes), so the next turn looks at those
			// few names again; so it does at anything else that wrote.
			rebase(t, tree, key, cache)
			// Base copies are in the layer beyond the target tree (its
			// writes were quiet): the next scan reads them, so the live
			// state it finds, and a later rollback plans from, is the
			// layer's (fstree's diffbase.go).
			t.Reread(res.BaseCopies)
			info.Tracker = t
		} else {
			r.retrack(tree, key, cache, o, info)
		}
	}
	return true, nil
}

// patchCache is the live scan's cache with removed paths (and what was
// below them) dropped and the entries Verify read put in. Entries of paths
// the diff did not touch stay valid: the cache is keyed by inode, size,
// mtime and ctime, which nothing changed. It patches c in place (no copy
// of a 2,000-entry map): the live scan's cache is the restore's own, made
// by its scan, and used for nothing else; a tracked scan's cache is a
// layer over its tracker's base (delta's cache_layers.go), which the
// patch leaves as it was. The hardlink roles are dropped: the next tracked
// scan that meets a hardlinked name walks.
func patchCache(c *fstree.ScanCache, removed []string, fresh map[string]fstree.CacheEntry) *fstree.ScanCache {
	c.Links, c.LinkNames = nil, nil
	for _, rel := range removed {
		if e, ok := c.Get(rel); ok && e.Entry.Type == delta.TypeDir {
			c.DeleteBelow(rel)
		}
		c.Delete(rel)
	}
	for rel, e := range fresh {
		c.Put(rel, e)
	}
	return c
}

// memTrees keeps a scan's trees in memory (its data chunks are dropped:
// the live layer's files are not stored) and serves them back to the plan.
type memTrees map[delta.ID][]byte

func (m memTrees) SaveBlob(_ context.Context, t delta.BlobType, id delta.ID, data []byte) (bool, error) {
	if t == delta.BlobTree {
		m[id] = data // treeBuffer hands over its own copy
	}
	return true, nil
}

func (m memTrees) LoadBlob(_ context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	if data, ok := m[id]; ok && t == delta.BlobTree {
		return data, nil
	}
	return nil, fmt.Errorf("live tree %s was not scanned", id.Short())
}

// originIndex names the index entry of an upper entry copied up from the
// base: overlay names it by the hex of the origin file handle, which the
// entry keeps in trusted.overlay.origin. "" if the entry has none.
func originIndex(index string, dirFD int, name string, buf []byte) (string, error) {
	n, err := unix.Lgetxattr(fsat.ProcPath(dirFD, name), originXattr, buf)
	if errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOTSUP) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read origin: %w", err)
	}
	return filepath.Join(index, hex.EncodeToString(buf[:n])), nil
}

// indexedNames is a copied-up file's link count less the link overlay's
// index keeps to it (nfs_export indexes every copied-up file).
func indexedNames(index string, dirFD int, name string, st *unix.Stat_t, buf []byte) (uint64, error) {
	n := uint64(st.Nlink)
	p, err := originIndex(index, dirFD, name, buf)
	if err != nil || p == "" {
		return n, err
	}
	var ist unix.Stat_t
	if unix.Lstat(p, &ist) == nil && fsat.SameFile(&ist, st) {
		n--
	}
	return n, nil
}

// dropIndex removes the index entry of an upper entry about to be
// removed. Left behind, it would still tie the base file to the removed
// upper inode, and the mount would turn it into a whiteout index that
// makes the base file read as EIO. Removing the index entry first is safe
// at any crash point: an upper entry whose index is gone reads as before.
func dropIndex(index string, dirFD int, name string, buf []byte) error {
	p, err := originIndex(index, dirFD, name, buf)
	if err != nil || p == "" {
		return err
	}
	err = unix.Unlink(p)
	if errors.Is(err, unix.EISDIR) {
		err = unix.Rmdir(p)
	}
	// ENAMETOOLONG: an origin no index entry can be named after.
	if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENAMETOOLONG) {
		return fmt.Errorf("drop index entry %s: %w", filepath.Base(p), err)
	}
	return nil
}

// dropWhiteoutIndex removes the whiteout and orphan entries of the index
// before a mount.
//
// overlay (nfs_export) leaves a whiteout when a copied-up base file is
// deleted, to make the base file unreachable by handle; once a restore
// removes the upper whiteout that hid the base file, the whiteout index
// makes the file read as EIO. While the upper whiteout stays, the name is
// hidden anyway, so dropping the index whiteout changes nothing visible.
//
// An orphan is a copied-up file's index link whose upper names are all
// gone (link count 1): overlay leaves one when such a file is deleted
// through the mount after it was renamed, and the next mount turns it into
// a whiteout index, so a restore that brings the base file's name back
// (or any mount, for another base name of a hardlinked file) reads it as
// EIO. Nothing in the upper names the inode, so the base file is what
// the layer shows there, as in a layer rebuilt whole (with a fresh index).
func dropWhiteoutIndex(index string) error {
	f, err := os.Open(index)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return err
	}
	for _, de := range ents {
		if de.Type()&os.ModeCharDevice == 0 && !de.Type().IsRegular() {
			continue
		}
		var st unix.Stat_t
		p := filepath.Join(index, de.Name())
		if unix.Lstat(p, &st) != nil {
			continue
		}
		whiteout := st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
		orphan := st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink == 1
		if whiteout || orphan {
			if err := unix.Unlink(p); err != nil && !errors.Is(err, unix.ENOENT) {
				return err
			}
		}
	}
	return nil
}
