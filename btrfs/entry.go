package btrfs

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// overlayXattrPrefix marks overlayfs bookkeeping. Such xattrs cannot be
// carried by the tree format (an overlay backend would read them as its own
// markers), so btrfs scans drop them exactly as overlay scans do.
const overlayXattrPrefix = "trusted.overlay."

// xattrBufSize bounds one xattr list or value read: the kernel's own limit.
const xattrBufSize = fsat.XattrBufSize

// statEntry fills the fields of an entry that lstat gives.
func statEntry(name string, st *unix.Stat_t) (delta.Entry, error) {
	e := delta.Entry{
		Name: name, Mode: st.Mode & 07777, UID: st.Uid, GID: st.Gid,
		MtimeNs: unix.TimespecToNsec(st.Mtim),
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Type = delta.TypeFile
	case unix.S_IFDIR:
		e.Type = delta.TypeDir
	case unix.S_IFLNK:
		e.Type = delta.TypeSymlink
	case unix.S_IFCHR:
		e.Type, e.Rdev = delta.TypeCharDev, st.Rdev
	case unix.S_IFBLK:
		e.Type, e.Rdev = delta.TypeBlockDev, st.Rdev
	case unix.S_IFIFO:
		e.Type = delta.TypeFIFO
	case unix.S_IFSOCK:
		e.Type = delta.TypeSocket
	default:
		return e, fmt.Errorf("unknown file type %#o", st.Mode&unix.S_IFMT)
	}
	return e, nil
}

// readXattrs returns the extended attributes of entry name of dirFD (not
// followed) sorted by name, without overlay's bookkeeping.
func readXattrs(dirFD int, name string, buf []byte) ([]delta.Xattr, error) {
	x, err := fsat.Xattrs(dirFD, name, buf, func(n string) bool { return strings.HasPrefix(n, overlayXattrPrefix) })
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return x, nil
}

// content is a file's chunk list.
type content = delta.FileContent

// readContent chunks and hashes file name (stat st) of dirFD in a
// read-only snapshot through files, which saves each chunk, skipping holes.
func readContent(ctx context.Context, dirFD int, name string, st *unix.Stat_t, files *fstree.FileReader) (content, error) {
	fd, err := unix.Openat(dirFD, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NOATIME|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return content{}, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	// The snapshot is read-only: the size cannot change under us.
	c, err := files.Read(ctx, f, st)
	if err != nil {
		return content{}, fmt.Errorf("read %s: %w", name, err)
	}
	return c, nil
}

// listAt lists directory rel beneath rootFD without following symlinks.
func listAt(rootFD int, rel string) ([]string, error) {
	fd, err := fsat.Open(rootFD, rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return fsat.ReadDirNames(fd)
}

// readNames lists a host directory of the pool without stat-ing its entries.
func readNames(p string) ([]string, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_NOATIME, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("list %s: %w", p, err)
	}
	return names, nil
}
