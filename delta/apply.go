package delta

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

// OpaqueXattr is how overlayfs marks an opaque directory on disk.
const OpaqueXattr = "trusted.overlay.opaque"

// ApplyOptions configures Materialise.
type ApplyOptions struct {
	Loader BlobLoader
	// AllowDevices permits creating any character and block device node; without
	// it only those CheckDevice passes are made. Off by
	// default: a checkpoint is data from storage, and a device node restored
	// into a sandbox is a way out of it. Whiteouts (0:0) are always allowed.
	AllowDevices bool
}

// ApplyStats counts what Materialise wrote.
type ApplyStats struct {
	Entries int64
	Files   int64
	Bytes   int64
}

// Materialise writes the state named by tree into dst, which must be an
// existing empty directory. Whiteouts and opaque directories are written in
// overlayfs's on-disk form, so the result can serve as an upper directory.
//
// Safety: every name was validated when its
// tree was decoded, every object is created fresh with O_EXCL/mkdir/mknod
// semantics and never opened through a symlink, and hardlinks may only point
// at files this call created, so nothing is written outside dst. Chunks are
// verified by the loader as they are read. The caller syncs the filesystem
// and re-derives the tree to confirm the result.
func Materialise(ctx context.Context, tree ID, dst string, opts ApplyOptions) (ApplyStats, error) {
	a := &applier{opts: opts, root: dst, files: map[string]bool{}}
	err := a.dir(ctx, tree, "")
	return a.stats, err
}

type applier struct {
	opts  ApplyOptions
	root  string
	files map[string]bool // root-relative paths of regular files created, for hardlinks
	stats ApplyStats
}

func (a *applier) dir(ctx context.Context, id ID, rel string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t, err := LoadTree(ctx, a.opts.Loader, id)
	if err != nil {
		return fmt.Errorf("/%s: %w", rel, err)
	}
	for i := range t.Entries {
		if err := a.entry(ctx, path.Join(rel, t.Entries[i].Name), &t.Entries[i]); err != nil {
			return err
		}
	}
	return nil
}

func (a *applier) entry(ctx context.Context, rel string, e *Entry) error {
	p := filepath.Join(a.root, rel)
	a.stats.Entries++
	fail := func(err error) error { return fmt.Errorf("restore %s: %w", p, err) }
	switch e.Type {
	case TypeDir:
		if err := unix.Mkdir(p, 0o700); err != nil {
			return fail(err)
		}
		if err := a.dir(ctx, e.Subtree, rel); err != nil {
			return err
		}
		if e.Opaque {
			if err := unix.Lsetxattr(p, OpaqueXattr, []byte("y"), 0); err != nil {
				return fail(fmt.Errorf("mark opaque: %w", err))
			}
		}
	case TypeFile:
		if err := a.file(ctx, p, e); err != nil {
			return fail(err)
		}
		a.files[rel] = true
	case TypeHardlink:
		if !a.files[e.Target] {
			return fail(fmt.Errorf("hardlink to %q, which is not a file restored before it: %w", e.Target, errdefs.ErrCorrupt))
		}
		if err := unix.Linkat(unix.AT_FDCWD, filepath.Join(a.root, e.Target), unix.AT_FDCWD, p, 0); err != nil {
			return fail(err)
		}
		return nil // a second name carries no metadata of its own
	case TypeSymlink:
		if err := unix.Symlink(e.Target, p); err != nil {
			return fail(err)
		}
	case TypeWhiteout:
		if err := unix.Mknod(p, unix.S_IFCHR, 0); err != nil {
			return fail(err)
		}
		return nil
	case TypeFIFO:
		if err := unix.Mknod(p, unix.S_IFIFO|0o600, 0); err != nil {
			return fail(err)
		}
	case TypeSocket:
		if err := unix.Mknod(p, unix.S_IFSOCK|0o600, 0); err != nil {
			return fail(err)
		}
	case TypeCharDev, TypeBlockDev:
		if !a.opts.AllowDevices {
			if err := CheckDevice(*e); err != nil {
				return fail(err)
			}
		}
		kind := uint32(unix.S_IFCHR)
		if e.Type == TypeBlockDev {
			kind = unix.S_IFBLK
		}
		if err := unix.Mknod(p, kind|0o600, int(e.Rdev)); err != nil {
			return fail(err)
		}
	default:
		return fail(fmt.Errorf("unknown entry type %d: %w", e.Type, errdefs.ErrCorrupt))
	}
	if err := setMeta(p, e); err != nil {
		return fail(err)
	}
	return nil
}

func (a *applier) file(ctx context.Context, p string, e *Entry) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := writeChunks(ctx, a.opts.Loader, f, e)
	if err != nil {
		return err
	}
	a.stats.Files++
	a.stats.Bytes += int64(n)
	return f.Close()
}

// writeChunks writes a file entry's content, each chunk verified by the
// loader, and checks it adds up to the entry's size.
func writeChunks(ctx context.Context, loader BlobLoader, w io.Writer, e *Entry) (uint64, error) {
	var n uint64
	for _, c := range e.Chunks {
		data, err := loader.LoadBlob(ctx, BlobData, c)
		if err != nil {
			return n, fmt.Errorf("chunk %s: %w", c.Short(), err)
		}
		if _, err := w.Write(data); err != nil {
			return n, err
		}
		n += uint64(len(data))
	}
	if n != e.Size {
		return n, fmt.Errorf("chunks hold %d bytes, entry says %d: %w", n, e.Size, errdefs.ErrCorrupt)
	}
	return n, nil
}

// setMeta applies ownership, mode, xattrs and mtime in the order that keeps
// each one: chown clears setuid bits and file capabilities, so it goes first;
// the mtime goes last because every other change would move it.
func setMeta(p string, e *Entry) error {
	if err := unix.Lchown(p, int(e.UID), int(e.GID)); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if e.Type != TypeSymlink {
		if err := unix.Chmod(p, e.Mode); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	for _, x := range e.Xattrs {
		if err := unix.Lsetxattr(p, x.Name, x.Value, 0); err != nil {
			return fmt.Errorf("xattr %s: %w", x.Name, err)
		}
	}
	ts := []unix.Timespec{unix.NsecToTimespec(e.MtimeNs), unix.NsecToTimespec(e.MtimeNs)}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set mtime: %w", err)
	}
	return nil
}
