// Package fsat resolves paths inside a sandbox-controlled directory tree
// relative to an open directory descriptor, never following a symlink and
// never leaving that directory. Every scanner and applier goes through it:
// the tree under the descriptor may be written by the sandbox while we walk
// it (a directory swapped for a symlink to the host must not take a scan or
// a restore outside), and in-sandbox paths may be longer than PATH_MAX once
// a host prefix is added, so host paths are never built from them.
package fsat

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Resolve is the openat2 resolution every lookup uses: stay beneath the
// starting directory, follow no symlink (magic links included).
const Resolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// pathMax is the kernel's limit on one path argument, NUL included.
const pathMax = 4096

// OpenDir opens the trusted host directory p (a sandbox's upper, a
// snapshot) as the anchor of a walk. p itself may be reached through
// symlinks the host made; nothing below it is.
func OpenDir(p string) (int, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: p, Err: err}
	}
	return fd, nil
}

// Open opens rel, a clean relative path ("" is dirFD itself), beneath
// dirFD without following any symlink: a symlink in any component is
// ELOOP, except a trailing one opened with O_PATH|O_NOFOLLOW, which gives a
// descriptor of the link itself. Paths too long for one call are walked a
// component at a time, each step with the same rules.
func Open(dirFD int, rel string, flags int) (int, error) {
	if rel == "" {
		rel = "."
	}
	if len(rel) < pathMax {
		fd, err := open2(dirFD, rel, flags)
		if !errors.Is(err, unix.ENAMETOOLONG) {
			return fd, err
		}
	}
	parts := strings.Split(rel, "/")
	cur := dirFD
	defer func() {
		if cur != dirFD {
			unix.Close(cur)
		}
	}()
	for _, p := range parts[:len(parts)-1] {
		next, err := open2(cur, p, unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return -1, err
		}
		if cur != dirFD {
			unix.Close(cur)
		}
		cur = next
	}
	return open2(cur, parts[len(parts)-1], flags)
}

func open2(dirFD int, rel string, flags int) (int, error) {
	for {
		fd, err := unix.Openat2(dirFD, rel, &unix.OpenHow{
			Flags:   uint64(flags) | unix.O_CLOEXEC | unix.O_NOFOLLOW,
			Resolve: Resolve,
		})
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue // openat2 RESOLVE_* returns EAGAIN on a concurrent rename
		}
		return fd, err
	}
}

// OpenParent opens the directory holding rel beneath dirFD (O_PATH) and
// returns it with rel's last component. The caller closes the descriptor.
func OpenParent(dirFD int, rel string) (int, string, error) {
	dir, name := "", rel
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		dir, name = rel[:i], rel[i+1:]
	}
	fd, err := Open(dirFD, dir, unix.O_PATH|unix.O_DIRECTORY)
	return fd, name, err
}

// Lstat stats rel beneath dirFD without following a symlink anywhere.
func Lstat(dirFD int, rel string, st *unix.Stat_t) error {
	fd, err := Open(dirFD, rel, unix.O_PATH)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fstat(fd, st)
}

// ProcPath names entry name of the directory open as dirFD for the
// path-only xattr calls: the magic link is our own descriptor, and the l*
// calls do not follow the last component. name must be one component.
func ProcPath(dirFD int, name string) string {
	return "/proc/self/fd/" + strconv.Itoa(dirFD) + "/" + name
}

// XattrBufSize bounds one xattr list or value: the kernel's own limit.
const XattrBufSize = 64 << 10

// Xattr is one extended attribute.
type Xattr struct {
	Name  string
	Value []byte
}

// Xattrs reads every extended attribute of entry name of dirFD (not
// following it), sorted by name, skipping names skip reports. buf is
// scratch space of XattrBufSize bytes.
func Xattrs(dirFD int, name string, buf []byte, skip func(string) bool) ([]Xattr, error) {
	p := ProcPath(dirFD, name)
	return read(buf, skip,
		func(b []byte) (int, error) { return unix.Llistxattr(p, b) },
		func(n string, b []byte) (int, error) { return unix.Lgetxattr(p, n, b) })
}

// XattrsFD reads every extended attribute of the open file or directory fd.
func XattrsFD(fd int, buf []byte, skip func(string) bool) ([]Xattr, error) {
	return read(buf, skip,
		func(b []byte) (int, error) { return unix.Flistxattr(fd, b) },
		func(n string, b []byte) (int, error) { return unix.Fgetxattr(fd, n, b) })
}

func read(buf []byte, skip func(string) bool, list func([]byte) (int, error), get func(string, []byte) (int, error)) ([]Xattr, error) {
	n, err := list(buf)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, fmt.Errorf("list xattrs: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	// The names are copied out of buf first, so buf then holds each value
	// in turn: a scan reads the xattrs of every entry it looks at, and a
	// value buffer of its own (64 KiB, zeroed) was most of what a tracked
	// turn allocated.
	names := strings.Split(string(buf[:n]), "\x00")
	vbuf := buf
	if len(vbuf) < XattrBufSize {
		vbuf = make([]byte, XattrBufSize)
	}
	var out []Xattr
	for _, name := range names {
		if name == "" || (skip != nil && skip(name)) {
			continue
		}
		vn, err := get(name, vbuf)
		if errors.Is(err, unix.ENODATA) {
			continue // removed between list and get
		}
		if err != nil {
			return nil, fmt.Errorf("xattr %s: %w", name, err)
		}
		out = append(out, Xattr{Name: name, Value: slices.Clone(vbuf[:vn])})
	}
	slices.SortFunc(out, func(a, b Xattr) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Readlink reads the target of symlink name in dirFD.
func Readlink(dirFD int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirFD, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
		if size >= pathMax*2 {
			return "", fmt.Errorf("symlink target longer than %d bytes: %w", size, unix.ENAMETOOLONG)
		}
	}
}

// SameFile reports whether two stats name the same inode.
func SameFile(a, b *unix.Stat_t) bool { return a.Dev == b.Dev && a.Ino == b.Ino }

// SyncDir makes a directory's entries durable (a rename into it, a new
// name or symlink): POSIX needs an fsync of the directory itself, not only
// of the files.
func SyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// WriteFileDurable replaces file p with body (mode 0600) so that a crash
// leaves either the old file or the new one, whole: written to p.tmp,
// synced, renamed over p, and p's directory synced.
func WriteFileDurable(p, body string) error {
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(body)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err == nil {
		err = SyncDir(filepath.Dir(p))
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
