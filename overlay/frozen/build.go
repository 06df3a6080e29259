package frozen

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"slices"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// freezer writes one frozen layer (Freeze): a walk of the checkpoint's
// tree beside the source layer's, every name made relative to the
// descriptor of its directory, nothing followed.
type freezer struct {
	ids    delta.IDs // the home's content ID scheme, copyLive's check
	loader delta.BlobLoader
	rootFD int // the new layer's top
	liveFD int // -1: no live root
	srcFD  int // -1: no source layer
	stats  *Stats
	xbuf   []byte
	yield  func() // Source.Yield, or nil
}

// dir fills the directory dstFD with tree id; srcID is the source layer's
// tree at the same path (zero: none).
func (f *freezer) dir(ctx context.Context, dstFD int, rel string, id, srcID delta.ID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t, err := delta.LoadTree(ctx, f.loader, id)
	if err != nil {
		return err
	}
	src, err := f.sourceTree(ctx, srcID)
	if err != nil {
		return err
	}
	for i := range t.Entries {
		e := &t.Entries[i]
		crel := path.Join(rel, e.Name)
		var se *delta.Entry
		if src != nil {
			se = src.Find(e.Name)
		}
		if err := f.entry(ctx, dstFD, crel, e, se); err != nil {
			return fmt.Errorf("/%s: %w", crel, err)
		}
	}
	return nil
}

// sourceTree loads the source layer's tree at a path (nil for a zero id:
// the source layer has nothing there), whose entries the freeze may link
// instead of copying.
func (f *freezer) sourceTree(ctx context.Context, id delta.ID) (*delta.Tree, error) {
	if id.IsZero() {
		return nil, nil
	}
	return delta.LoadTree(ctx, f.loader, id)
}

func (f *freezer) entry(ctx context.Context, dstFD int, rel string, e, se *delta.Entry) error {
	f.stats.Entries++
	if f.yield != nil {
		f.yield()
	}
	switch e.Type {
	case delta.TypeDir:
		if err := unix.Mkdirat(dstFD, e.Name, 0o700); err != nil {
			return err
		}
		fd, err := fsat.Open(dstFD, e.Name, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		var srcSub delta.ID
		if se != nil && se.Type == delta.TypeDir && f.srcFD >= 0 {
			srcSub = se.Subtree
		}
		if err := f.dir(ctx, fd, rel, e.Subtree, srcSub); err != nil {
			return err
		}
		if e.Opaque {
			if err := unix.Fsetxattr(fd, fstree.OpaqueXattr, []byte("y"), 0); err != nil {
				return fmt.Errorf("mark opaque: %w", err)
			}
		}
		return setMetaFD(fd, e)
	case delta.TypeFile:
		if se != nil && f.srcFD >= 0 && sameFile(e, se) {
			if err := f.cloneFrom(dstFD, rel, e); err == nil {
				f.stats.Linked++
				return nil
			}
			// The source lost the file (it is never written), or a sparse
			// file cannot be reflinked: copy from live or the store instead.
		}
		return f.file(ctx, dstFD, rel, e)
	case delta.TypeWhiteout:
		return unix.Mknodat(dstFD, e.Name, unix.S_IFCHR, 0)
	case delta.TypeHardlink:
		// The primary comes first in the walk's order; a stacked root links
		// the group's names up together (linkUp), as over a base.
		tfd, err := fsat.Open(f.rootFD, e.Target, unix.O_PATH|unix.O_NOFOLLOW)
		if err != nil {
			return fmt.Errorf("hardlink target %s: %w", e.Target, err)
		}
		defer unix.Close(tfd)
		return unix.Linkat(tfd, "", dstFD, e.Name, unix.AT_EMPTY_PATH)
	case delta.TypeSymlink:
		if err := unix.Symlinkat(e.Target, dstFD, e.Name); err != nil {
			return err
		}
		return setMetaAt(dstFD, e)
	case delta.TypeFIFO, delta.TypeSocket:
		kind := uint32(unix.S_IFIFO)
		if e.Type == delta.TypeSocket {
			kind = unix.S_IFSOCK
		}
		if err := unix.Mknodat(dstFD, e.Name, kind|0o600, 0); err != nil {
			return err
		}
		return setMetaAt(dstFD, e)
	}
	return fmt.Errorf("%s entry: %w", e.Type, ErrNotFreezable)
}

// sameFile reports whether two file entries are one inode's worth of
// state: a hardlink shares content and metadata.
func sameFile(a, b *delta.Entry) bool {
	return b.Type == delta.TypeFile && a.Size == b.Size && a.Mode == b.Mode && a.UID == b.UID &&
		a.GID == b.GID && a.MtimeNs == b.MtimeNs && delta.SameChunks(a, b) && slices.Equal(a.Holes, b.Holes) &&
		slices.EqualFunc(a.Xattrs, b.Xattrs, func(x, y delta.Xattr) bool {
			return x.Name == y.Name && string(x.Value) == string(y.Value)
		})
}

// file writes file entry e: copied from the live root if its bytes chunk
// and hash to e's chunks, else from the store.
func (f *freezer) file(ctx context.Context, dstFD int, rel string, e *delta.Entry) error {
	fd, err := unix.Openat(dstFD, e.Name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	out := os.NewFile(uintptr(fd), e.Name)
	defer out.Close()
	if f.liveFD >= 0 && f.copyLive(ctx, out, rel, e) == nil {
		f.stats.Copied++
	} else {
		if err := resetFile(out); err != nil {
			return err
		}
		if err := f.fromStore(ctx, out, e); err != nil {
			return err
		}
		f.stats.FromStore++
	}
	f.stats.Bytes += int64(e.Size)
	if err := setMetaFD(fd, e); err != nil {
		return err
	}
	return out.Close()
}

var errLiveChanged = errors.New("live file differs from the checkpoint")

// cloneFrom makes file e in dstFD a copy of the source layer's file at rel
// (equal to e, sameFile): a reflink where the filesystem shares extents
// (btrfs, xfs), else an in-kernel copy. Never a hardlink: a frozen layer is
// a lower layer of the sandboxes stacked on it, and overlayfs shows a
// lower file's own link count, so a file shared by two layers would show
// st_nlink 2 inside a sandbox that has one name for it (tar, rsync -H and
// security checks would see hardlinks that are not there; issue 24, 5d).
// On an error nothing is left at e.Name.
func (f *freezer) cloneFrom(dstFD int, rel string, e *delta.Entry) (err error) {
	in, err := fsat.Open(f.srcFD, rel, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK)
	if err != nil {
		return err
	}
	defer unix.Close(in)
	var st unix.Stat_t
	if err := unix.Fstat(in, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || uint64(st.Size) != e.Size {
		return errLiveChanged
	}
	out, err := unix.Openat(dstFD, e.Name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		unix.Close(out)
		if err != nil {
			unix.Unlinkat(dstFD, e.Name, 0)
		}
	}()
	if err := unix.IoctlFileClone(out, in); err != nil {
		if len(e.Holes) > 0 {
			return err // a plain copy would fill the holes: write it from live or the store
		}
		for left := st.Size; left > 0; {
			n, err := unix.CopyFileRange(in, nil, out, nil, int(min(left, 1<<30)), 0)
			if err != nil {
				return fmt.Errorf("copy from the source layer: %w", err)
			}
			if n == 0 {
				return errLiveChanged // shorter than it said
			}
			left -= int64(n)
		}
	}
	return setMetaFD(out, e)
}

// copyLive copies rel from the live root into out, chunking it the way a
// scan does and checking each chunk's hash against e's, so the copy holds
// the checkpoint's bytes or is refused.
func (f *freezer) copyLive(ctx context.Context, out *os.File, rel string, e *delta.Entry) error {
	in, err := fsat.Open(f.liveFD, rel, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK)
	if err != nil {
		return err
	}
	src := os.NewFile(uintptr(in), rel)
	defer src.Close()
	var st unix.Stat_t
	if err := unix.Fstat(in, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || uint64(st.Size) != e.Size {
		return errLiveChanged
	}
	if len(e.Holes) > 0 || !e.Resolved() {
		// A sparse file's chunks cover its data runs only: the store's
		// copy is laid out with its holes (fromStore). (A chunk list not
		// loaded: fromStore loads it.)
		return errLiveChanged
	}
	i := 0
	var n uint64
	err = delta.NewChunker().Chunk(src, st.Size, func(data []byte) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if i >= len(e.Chunks) || f.ids.Hash(data) != e.Chunks[i] {
			return errLiveChanged
		}
		i++
		n += uint64(len(data))
		_, err := out.Write(data)
		return err
	})
	if err != nil {
		return err
	}
	if i != len(e.Chunks) || n != e.Size {
		return errLiveChanged
	}
	return nil
}

// fromStore writes e's content as the loader returns it (verified), holes
// kept as holes (fstree.WriteContent, the restores' one writer).
func (f *freezer) fromStore(ctx context.Context, out *os.File, e *delta.Entry) error {
	_, err := fstree.WriteContent(ctx, f.loader, out, e, false)
	return err
}

func resetFile(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.Seek(0, 0)
	return err
}

// setMetaFD sets an open file's or directory's metadata from e: owner
// first (chown clears setuid bits), mtime last.
func setMetaFD(fd int, e *delta.Entry) error {
	if err := unix.Fchown(fd, int(e.UID), int(e.GID)); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := unix.Fchmod(fd, e.Mode); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	for _, x := range e.Xattrs {
		if err := unix.Fsetxattr(fd, x.Name, x.Value, 0); err != nil {
			return fmt.Errorf("xattr %s: %w", x.Name, err)
		}
	}
	ts := []unix.Timespec{unix.NsecToTimespec(e.MtimeNs), unix.NsecToTimespec(e.MtimeNs)}
	return unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH)
}

// setMetaAt sets the metadata of a node just made in dirFD (a symlink, a
// fifo, a socket) without following it.
func setMetaAt(dirFD int, e *delta.Entry) error {
	if err := unix.Fchownat(dirFD, e.Name, int(e.UID), int(e.GID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if e.Type != delta.TypeSymlink {
		if err := unix.Fchmodat(dirFD, e.Name, e.Mode, 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	p := fsat.ProcPath(dirFD, e.Name)
	for _, x := range e.Xattrs {
		if err := unix.Lsetxattr(p, x.Name, x.Value, 0); err != nil {
			return fmt.Errorf("xattr %s: %w", x.Name, err)
		}
	}
	ts := []unix.Timespec{unix.NsecToTimespec(e.MtimeNs), unix.NsecToTimespec(e.MtimeNs)}
	return unix.UtimesNanoAt(dirFD, e.Name, ts, unix.AT_SYMLINK_NOFOLLOW)
}
