package frozen

import (
	"context"
	"fmt"
	"os"
	"path"
	"slices"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// An incremental freeze (Source.Reuse) does not build the new layer
// from nothing: it takes a layer no retention rule keeps any more out of
// the namespace and turns it into the new tree, touching only the names
// whose entries differ between the two trees. The trees share unchanged
// subtrees by ID, so the walk skips an equal subtree without loading it,
// as a diff does: the cost is the change between the two trees, not the
// layer's size (a full build makes every directory and hardlinks every
// file; its removal later unlinks them all again).
//
// Why it is safe: the taken layer is unpublished (renamed to .tmp-*, under
// the backend's lock, only when no root stacks on it and no other freeze
// reads it), so nothing mounts it. Its files are hardlinks other layers
// share, so a file is never written in place: a file whose entry differs
// is unlinked and made anew (linked from the source layer or copied and
// verified, as in a full build). Directories belong to one layer only, so
// their metadata is set in place, stale xattrs removed. Hardlink groups
// (TypeHardlink) name their primary by path from anywhere in the tree, so
// an unchanged subtree can still hold a name of a changed file: a tree
// holding any is built in full instead (hasLinks).

// patch changes directory dstFD, which holds tree oldID, into tree id;
// srcID is the source layer's tree at the same path (zero: none).
func (f *freezer) patch(ctx context.Context, dstFD int, rel string, id, oldID, srcID delta.ID) error {
	if id == oldID {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	t, err := delta.LoadTree(ctx, f.loader, id)
	if err != nil {
		return err
	}
	old, err := delta.LoadTree(ctx, f.loader, oldID)
	if err != nil {
		return err
	}
	src, err := f.sourceTree(ctx, srcID)
	if err != nil {
		return err
	}
	for i := range old.Entries {
		if t.Find(old.Entries[i].Name) == nil {
			if err := removeAt(dstFD, old.Entries[i].Name); err != nil {
				return fmt.Errorf("/%s: %w", path.Join(rel, old.Entries[i].Name), err)
			}
			f.stats.Removed++
		}
	}
	for i := range t.Entries {
		e := &t.Entries[i]
		oe := old.Find(e.Name)
		if oe != nil && sameEntry(e, oe) {
			continue
		}
		crel := path.Join(rel, e.Name)
		var se *delta.Entry
		if src != nil {
			se = src.Find(e.Name)
		}
		if err := f.patchEntry(ctx, dstFD, crel, e, oe, se); err != nil {
			return fmt.Errorf("/%s: %w", crel, err)
		}
	}
	return nil
}

func (f *freezer) patchEntry(ctx context.Context, dstFD int, rel string, e, oe, se *delta.Entry) error {
	f.stats.Patched++
	if oe != nil && oe.Type == delta.TypeDir && e.Type == delta.TypeDir {
		fd, err := fsat.Open(dstFD, e.Name, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		var srcSub delta.ID
		if se != nil && se.Type == delta.TypeDir && f.srcFD >= 0 {
			srcSub = se.Subtree
		}
		if err := f.patch(ctx, fd, rel, e.Subtree, oe.Subtree, srcSub); err != nil {
			return err
		}
		// The directory is this layer's own: its xattrs are made equal to
		// the entry's (the opaque mark included), then its metadata.
		have, err := fsat.XattrsFD(fd, f.xbuf, nil)
		if err != nil {
			return fmt.Errorf("xattrs: %w", err)
		}
		for _, x := range have {
			if x.Name == fstree.OpaqueXattr && e.Opaque {
				continue
			}
			if !slices.ContainsFunc(e.Xattrs, func(y delta.Xattr) bool { return y.Name == x.Name }) {
				if err := unix.Fremovexattr(fd, x.Name); err != nil {
					return fmt.Errorf("remove xattr %s: %w", x.Name, err)
				}
			}
		}
		if e.Opaque && !oe.Opaque {
			if err := unix.Fsetxattr(fd, fstree.OpaqueXattr, []byte("y"), 0); err != nil {
				return fmt.Errorf("mark opaque: %w", err)
			}
		}
		return setMetaFD(fd, e)
	}
	if oe != nil {
		if err := removeAt(dstFD, e.Name); err != nil {
			return err
		}
	}
	return f.entry(ctx, dstFD, rel, e, se)
}

// removeAt removes name from dirFD, a directory with all it holds.
func removeAt(dirFD int, name string) error {
	err := unix.Unlinkat(dirFD, name, 0)
	if err == unix.EISDIR || err == unix.EPERM {
		return os.RemoveAll(fsat.ProcPath(dirFD, name))
	}
	return err
}

// sameEntry reports whether two entries record the same node: for a
// directory, the same metadata and the same subtree.
func sameEntry(a, b *delta.Entry) bool {
	return a.Type == b.Type && a.Mode == b.Mode && a.UID == b.UID && a.GID == b.GID && a.MtimeNs == b.MtimeNs &&
		a.Size == b.Size && a.Target == b.Target && a.Rdev == b.Rdev && a.Opaque == b.Opaque &&
		a.Subtree == b.Subtree && delta.SameChunks(a, b) &&
		slices.EqualFunc(a.Xattrs, b.Xattrs, func(x, y delta.Xattr) bool {
			return x.Name == y.Name && string(x.Value) == string(y.Value)
		})
}

// hasLinks reports whether tree id holds a hardlink entry anywhere. The
// answer for every subtree is kept (bounded), so a tree sharing most of
// its subtrees with one asked before loads only the new ones.
func (b *Layers) hasLinks(ctx context.Context, loader delta.BlobLoader, id delta.ID) (bool, error) {
	b.memoMu.Lock()
	v, ok := b.links[id]
	b.memoMu.Unlock()
	if ok {
		return v, nil
	}
	t, err := delta.LoadTree(ctx, loader, id)
	if err != nil {
		return false, err
	}
	found := false
	for i := range t.Entries {
		e := &t.Entries[i]
		if e.Type == delta.TypeHardlink {
			found = true
			break
		}
		if e.Type == delta.TypeDir {
			if found, err = b.hasLinks(ctx, loader, e.Subtree); err != nil {
				return false, err
			} else if found {
				break
			}
		}
	}
	b.memoMu.Lock()
	if b.links == nil || len(b.links) > maxLinkMemo {
		b.links = map[delta.ID]bool{}
	}
	b.links[id] = found
	b.memoMu.Unlock()
	return found, nil
}

// maxLinkMemo bounds hasLinks' memory (a few MB).
const maxLinkMemo = 1 << 16
