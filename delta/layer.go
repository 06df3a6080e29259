package delta

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

// ApplyLayer writes tree, a writable layer in overlay upper form, onto the
// existing directory tree dst, so that dst becomes its old contents merged
// with tree the way overlayfs would merge them: a whiteout deletes the name,
// an opaque directory replaces whatever was there (its old contents are
// gone), any other directory is merged into an existing directory of the
// same name, and every other entry replaces the name with a new inode.
// Metadata is set exactly, xattrs included (xattrs the entry does not list
// are removed, except overlay's own trusted.overlay.* bookkeeping).
//
// Safety: dst may hold anything, symlinks
// included, and none is ever followed: every directory is opened from its
// parent's descriptor with openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, every
// name is created or removed relative to that descriptor, and hardlinks may
// only point at files this call created. Chunks are verified by the loader.
// The caller re-derives the result to confirm it.
func ApplyLayer(ctx context.Context, tree ID, dst string, opts ApplyOptions) (ApplyStats, error) {
	fd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return ApplyStats{}, fmt.Errorf("apply onto %s: %w", dst, err)
	}
	defer unix.Close(fd)
	l := &layerApplier{opts: opts, root: dst, rootFD: fd, files: map[string]bool{}}
	err = l.dir(ctx, fd, tree, "")
	return l.stats, err
}

type layerApplier struct {
	opts   ApplyOptions
	root   string
	rootFD int
	files  map[string]bool // root-relative paths of regular files created, for hardlinks
	stats  ApplyStats
}

// openBeneath opens name below dirFD without following any symlink.
func openBeneath(dirFD int, name string, flags uint64) (int, error) {
	return unix.Openat2(dirFD, name, &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
}

func (l *layerApplier) dir(ctx context.Context, dirFD int, id ID, rel string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t, err := LoadTree(ctx, l.opts.Loader, id)
	if err != nil {
		return fmt.Errorf("/%s: %w", rel, err)
	}
	for i := range t.Entries {
		e := &t.Entries[i]
		p := path.Join(rel, e.Name)
		if err := l.entry(ctx, dirFD, p, e); err != nil {
			return fmt.Errorf("apply %s: %w", path.Join(l.root, p), err)
		}
	}
	return nil
}

func (l *layerApplier) entry(ctx context.Context, dirFD int, rel string, e *Entry) error {
	l.stats.Entries++
	var st unix.Stat_t
	exists := unix.Fstatat(dirFD, e.Name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
	isDir := exists && st.Mode&unix.S_IFMT == unix.S_IFDIR
	if e.Type == TypeDir && !e.Opaque && isDir {
		return l.subdir(ctx, dirFD, rel, e) // merge into the existing directory
	}
	if exists {
		if err := removeAt(dirFD, e.Name); err != nil {
			return err
		}
	}
	switch e.Type {
	case TypeWhiteout:
		return nil
	case TypeDir:
		if err := unix.Mkdirat(dirFD, e.Name, 0o700); err != nil {
			return err
		}
		return l.subdir(ctx, dirFD, rel, e)
	case TypeFile:
		return l.file(ctx, dirFD, rel, e)
	case TypeHardlink:
		if !l.files[e.Target] {
			return fmt.Errorf("hardlink to %q, which is not a file restored before it: %w", e.Target, errdefs.ErrCorrupt)
		}
		tfd, err := openBeneath(l.rootFD, e.Target, unix.O_PATH)
		if err != nil {
			return fmt.Errorf("hardlink target %s: %w", e.Target, err)
		}
		defer unix.Close(tfd)
		return unix.Linkat(tfd, "", dirFD, e.Name, unix.AT_EMPTY_PATH)
	case TypeSymlink:
		if err := unix.Symlinkat(e.Target, dirFD, e.Name); err != nil {
			return err
		}
	case TypeFIFO, TypeSocket, TypeCharDev, TypeBlockDev:
		kind := map[Type]uint32{TypeFIFO: unix.S_IFIFO, TypeSocket: unix.S_IFSOCK, TypeCharDev: unix.S_IFCHR, TypeBlockDev: unix.S_IFBLK}[e.Type]
		if !l.opts.AllowDevices {
			if err := CheckDevice(*e); err != nil {
				return err
			}
		}
		if err := unix.Mknodat(dirFD, e.Name, kind|0o600, int(e.Rdev)); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown entry type %d: %w", e.Type, errdefs.ErrCorrupt)
	}
	return setMetaAt(dirFD, e)
}

func (l *layerApplier) subdir(ctx context.Context, dirFD int, rel string, e *Entry) error {
	fd, err := openBeneath(dirFD, e.Name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := l.dir(ctx, fd, e.Subtree, rel); err != nil {
		return err
	}
	// An opaque directory was created fresh above; merged, it simply holds
	// nothing else, so no marker is written.
	return setMetaFD(fd, e)
}

func (l *layerApplier) file(ctx context.Context, dirFD int, rel string, e *Entry) error {
	fd, err := unix.Openat(dirFD, e.Name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), e.Name)
	defer f.Close()
	n, err := writeChunks(ctx, l.opts.Loader, f, e)
	if err != nil {
		return err
	}
	l.files[rel] = true
	l.stats.Files++
	l.stats.Bytes += int64(n)
	if err := setMetaFD(int(f.Fd()), e); err != nil {
		return err
	}
	return f.Close()
}

// setMetaFD sets an open file's or directory's metadata, in the order that
// keeps each part (see setMeta).
func setMetaFD(fd int, e *Entry) error {
	if err := unix.Fchown(fd, int(e.UID), int(e.GID)); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := unix.Fchmod(fd, e.Mode); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	if err := syncXattrs(xattrTarget{fd: fd}, e.Xattrs); err != nil {
		return err
	}
	ts := []unix.Timespec{unix.NsecToTimespec(e.MtimeNs), unix.NsecToTimespec(e.MtimeNs)}
	if err := unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH); err != nil {
		return fmt.Errorf("set mtime: %w", err)
	}
	return nil
}

// setMetaAt sets the metadata of a name just created in dirFD that cannot
// be opened safely (symlinks, fifos, sockets, devices).
func setMetaAt(dirFD int, e *Entry) error {
	if err := unix.Fchownat(dirFD, e.Name, int(e.UID), int(e.GID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if e.Type != TypeSymlink {
		// The name is a node this call just made in a directory nothing
		// else writes to, so the lack of a no-follow chmod is harmless.
		if err := unix.Fchmodat(dirFD, e.Name, e.Mode, 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	if err := syncXattrs(xattrTarget{fd: -1, path: procPath(dirFD, e.Name)}, e.Xattrs); err != nil {
		return err
	}
	ts := []unix.Timespec{unix.NsecToTimespec(e.MtimeNs), unix.NsecToTimespec(e.MtimeNs)}
	if err := unix.UtimesNanoAt(dirFD, e.Name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set mtime: %w", err)
	}
	return nil
}

// procPath names the entry name of the directory open as dirFD for the
// path-based xattr calls: the magic link resolves to the directory itself,
// and the l* calls do not follow the final component.
func procPath(dirFD int, name string) string {
	return "/proc/self/fd/" + strconv.Itoa(dirFD) + "/" + name
}

// xattrTarget is an open descriptor (fd >= 0) or a path not to follow.
type xattrTarget struct {
	fd   int
	path string
}

func (x xattrTarget) list(buf []byte) (int, error) {
	if x.fd >= 0 {
		return unix.Flistxattr(x.fd, buf)
	}
	return unix.Llistxattr(x.path, buf)
}

func (x xattrTarget) set(name string, v []byte) error {
	if x.fd >= 0 {
		return unix.Fsetxattr(x.fd, name, v, 0)
	}
	return unix.Lsetxattr(x.path, name, v, 0)
}

func (x xattrTarget) remove(name string) error {
	if x.fd >= 0 {
		return unix.Fremovexattr(x.fd, name)
	}
	return unix.Lremovexattr(x.path, name)
}

// syncXattrs makes the xattrs of t exactly want (sorted), leaving overlay's
// own trusted.overlay.* bookkeeping alone.
func syncXattrs(t xattrTarget, want []Xattr) error {
	buf := make([]byte, xattrBufSize)
	n, err := t.list(buf)
	if err != nil && !errors.Is(err, unix.ENOTSUP) {
		return fmt.Errorf("list xattrs: %w", err)
	}
	for _, name := range strings.Split(string(buf[:max(n, 0)]), "\x00") {
		if name == "" || strings.HasPrefix(name, "trusted.overlay.") {
			continue
		}
		keep := false
		for _, x := range want {
			keep = keep || x.Name == name
		}
		if !keep {
			if err := t.remove(name); err != nil && !errors.Is(err, unix.ENODATA) {
				return fmt.Errorf("remove xattr %s: %w", name, err)
			}
		}
	}
	for _, x := range want {
		if err := t.set(x.Name, x.Value); err != nil {
			return fmt.Errorf("xattr %s: %w", x.Name, err)
		}
	}
	return nil
}

// removeAt deletes name from dirFD, a whole directory tree included,
// without following symlinks. A name that does not exist is not an error.
func removeAt(dirFD int, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirFD, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return ignoreENOENT(unix.Unlinkat(dirFD, name, 0))
	}
	fd, err := openBeneath(dirFD, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	names, err := f.Readdirnames(-1)
	if err != nil && err != io.EOF {
		f.Close()
		return err
	}
	for _, n := range names {
		if err := removeAt(fd, n); err != nil {
			f.Close()
			return err
		}
	}
	f.Close()
	return ignoreENOENT(unix.Unlinkat(dirFD, name, unix.AT_REMOVEDIR))
}

func ignoreENOENT(err error) error {
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}
