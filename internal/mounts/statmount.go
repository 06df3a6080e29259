package mounts

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrNoStatmount says the kernel cannot answer SuperOptions (statmount(2)
// is Linux 6.8, its mount options 6.11): the caller reads the mount table.
var ErrNoStatmount = errors.New("statmount cannot tell a mount's options on this kernel")

// Mount is what SuperOptions tells of the mount at a path.
type Mount struct {
	// Point is the mount point, FSType the filesystem type.
	Point, FSType string
	// VFSOptions are the super options as /proc/self/mountinfo's last
	// field lists them: "rw" or "ro", the superblock flags, then the
	// filesystem's own options, comma-separated and escaped alike.
	VFSOptions string
}

// SuperOptions tells the topmost mount at path by statx(STATX_MNT_ID_UNIQUE)
// and statmount(2): two system calls, where reading the mount table makes
// the kernel print every mount of the namespace (a machine running many
// sandboxes has hundreds) for the one line wanted. A path with no mount of
// its own answers its parent mount: callers compare Point. ErrNoStatmount:
// the kernel is too old.
func SuperOptions(path string) (Mount, error) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_NO_AUTOMOUNT, unix.STATX_MNT_ID_UNIQUE, &stx); err != nil {
		return Mount{}, fmt.Errorf("statx %s: %w", path, err)
	}
	if stx.Mask&unix.STATX_MNT_ID_UNIQUE == 0 {
		return Mount{}, ErrNoStatmount
	}
	const want = statmountSBBasic | statmountMntPoint | statmountFSType | statmountMntOpts
	req := mntIDReq{size: mntIDReqSizeVer0, mntID: stx.Mnt_id, param: want}
	buf := make([]byte, 4096)
	for {
		_, _, errno := unix.Syscall6(unix.SYS_STATMOUNT, uintptr(unsafe.Pointer(&req)),
			uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0, 0, 0)
		switch {
		case errno == unix.EOVERFLOW && len(buf) < 1<<20:
			buf = make([]byte, 4*len(buf))
			continue
		case errno == unix.ENOSYS || errno == unix.EINVAL || errno == unix.EPERM:
			return Mount{}, ErrNoStatmount
		case errno != 0:
			return Mount{}, fmt.Errorf("statmount %s: %w", path, errno)
		}
		return parseStatmount(buf, want)
	}
}

// The parts of struct statmount (include/uapi/linux/mount.h) read here.
const (
	statmountSBBasic  = 0x1
	statmountMntPoint = 0x10
	statmountFSType   = 0x20
	statmountMntOpts  = 0x80

	mntIDReqSizeVer0 = 24
	// statmountSize is sizeof(struct statmount): its string offsets
	// count from there.
	statmountSize = 512

	sbRdonly      = 1
	sbSynchronous = 16
	sbDirsync     = 128
	sbLazytime    = 1 << 25
)

type mntIDReq struct {
	size  uint32
	spare uint32
	mntID uint64
	param uint64
}

// parseStatmount reads a statmount answer: the mask of what it holds at
// offset 8, sb_flags at 32, the offsets of fs_type at 36, mnt_point at
// 108 and mnt_opts at 4, each into the strings after the header.
func parseStatmount(buf []byte, want uint64) (Mount, error) {
	le := binary.NativeEndian
	if len(buf) < statmountSize {
		return Mount{}, fmt.Errorf("statmount: %d bytes: %w", len(buf), ErrNoStatmount)
	}
	size := int(le.Uint32(buf[0:]))
	if size < statmountSize || size > len(buf) {
		return Mount{}, fmt.Errorf("statmount: answer of %d bytes in %d", size, len(buf))
	}
	if le.Uint64(buf[8:])&want != want {
		return Mount{}, ErrNoStatmount // a kernel without mount options
	}
	strs := buf[statmountSize:size]
	str := func(off uint32) (string, error) {
		if int(off) >= len(strs) {
			return "", fmt.Errorf("statmount: string at %d of %d bytes", off, len(strs))
		}
		s := strs[off:]
		i := bytes.IndexByte(s, 0)
		if i < 0 {
			return "", fmt.Errorf("statmount: string at %d not terminated", off)
		}
		return string(s[:i]), nil
	}
	var m Mount
	var opts string
	var err error
	if m.FSType, err = str(le.Uint32(buf[36:])); err != nil {
		return Mount{}, err
	}
	if m.Point, err = str(le.Uint32(buf[108:])); err != nil {
		return Mount{}, err
	}
	if opts, err = str(le.Uint32(buf[4:])); err != nil {
		return Mount{}, err
	}
	// mountinfo's order (fs/proc_namespace.c show_mountinfo): rw or ro,
	// the superblock flags (show_sb_opts), then the options.
	flags := le.Uint32(buf[32:])
	v := "rw"
	if flags&sbRdonly != 0 {
		v = "ro"
	}
	for _, f := range []struct {
		bit  uint32
		name string
	}{{sbSynchronous, ",sync"}, {sbDirsync, ",dirsync"}, {sbLazytime, ",lazytime"}} {
		if flags&f.bit != 0 {
			v += f.name
		}
	}
	if opts != "" {
		v += "," + opts
	}
	m.VFSOptions = v
	return m, nil
}
