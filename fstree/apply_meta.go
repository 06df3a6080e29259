package fstree

import (
	"errors"
	"fmt"
	"github.com/turnsnap/turnsnap/delta"
	"strings"

	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// metaTarget is what setMeta changes: an open file or directory (fd >= 0),
// or the entry name of the directory dirFD for what cannot be opened safely
// (symlinks, fifos, sockets, devices). Either way nothing is followed.
type metaTarget struct {
	fd    int
	dirFD int
	name  string
}

// setMeta is the one metadata setter of every restore: ownership, mode,
// xattrs and mtime, in the order that keeps each one (chown clears setuid
// bits and file capabilities, so it goes first; the mtime goes last because
// every other change would move it). xattrs the entry does not list are
// removed, except overlay's own trusted.overlay.* bookkeeping.
func setMeta(t metaTarget, e *delta.Entry) error {
	ts := []unix.Timespec{unix.NsecToTimespec(e.MtimeNs), unix.NsecToTimespec(e.MtimeNs)}
	if t.fd >= 0 {
		if err := unix.Fchown(t.fd, int(e.UID), int(e.GID)); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
		if err := unix.Fchmod(t.fd, e.Mode); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
		if err := t.syncXattrs(e.Xattrs); err != nil {
			return err
		}
		if err := unix.UtimesNanoAt(t.fd, "", ts, unix.AT_EMPTY_PATH); err != nil {
			return fmt.Errorf("set mtime: %w", err)
		}
		return nil
	}
	if err := unix.Fchownat(t.dirFD, t.name, int(e.UID), int(e.GID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if e.Type != delta.TypeSymlink {
		// The name is a node this call just made (not a symlink), so the
		// lack of a no-follow chmod is harmless.
		if err := unix.Fchmodat(t.dirFD, t.name, e.Mode, 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	if err := t.syncXattrs(e.Xattrs); err != nil {
		return err
	}
	if err := unix.UtimesNanoAt(t.dirFD, t.name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set mtime: %w", err)
	}
	return nil
}

func (t metaTarget) list(buf []byte) (int, error) {
	if t.fd >= 0 {
		return unix.Flistxattr(t.fd, buf)
	}
	return unix.Llistxattr(fsat.ProcPath(t.dirFD, t.name), buf)
}

func (t metaTarget) set(name string, v []byte) error {
	if t.fd >= 0 {
		return unix.Fsetxattr(t.fd, name, v, 0)
	}
	return unix.Lsetxattr(fsat.ProcPath(t.dirFD, t.name), name, v, 0)
}

func (t metaTarget) remove(name string) error {
	if t.fd >= 0 {
		return unix.Fremovexattr(t.fd, name)
	}
	return unix.Lremovexattr(fsat.ProcPath(t.dirFD, t.name), name)
}

// syncXattrs makes the target's xattrs exactly want (sorted), leaving
// overlay's own trusted.overlay.* bookkeeping alone.
func (t metaTarget) syncXattrs(want []delta.Xattr) error {
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
	fd, err := fsat.Open(dirFD, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	names, err := fsat.ReadDirNames(fd)
	if err != nil {
		unix.Close(fd)
		return err
	}
	for _, n := range names {
		if err := removeAt(fd, n); err != nil {
			unix.Close(fd)
			return err
		}
	}
	unix.Close(fd)
	return ignoreENOENT(unix.Unlinkat(dirFD, name, unix.AT_REMOVEDIR))
}

func ignoreENOENT(err error) error {
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}
