package btrfs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ioctl request numbers and struct layouts from linux/btrfs.h (x86-64 and
// every other 64-bit Linux: the structs have no pointer-size dependent
// fields). Checked against the kernel headers by TestIoctlLayout's values.
const (
	iocSync          = 0x9408
	iocSubvolCreate  = 0x5000940e
	iocSnapDestroy   = 0x5000940f
	iocTreeSearchV2  = 0xc0709411
	iocStartSync     = 0x80089418
	iocWaitSync      = 0x40089416
	iocSnapCreateV2  = 0x50009417
	iocSubvolGetflag = 0x80089419
	iocSubvolSetflag = 0x4008941a
	iocInoPaths      = 0xc0389423
	iocGetSubvolInfo = 0x81f8943c

	volArgsSize   = 4096 // struct btrfs_ioctl_vol_args / _v2
	volNameOff    = 8    // btrfs_ioctl_vol_args.name
	volV2NameOff  = 56   // btrfs_ioctl_vol_args_v2.name
	volV2NameMax  = volArgsSize - volV2NameOff - 1
	subvolRdonly  = 1 << 1 // BTRFS_SUBVOL_RDONLY
	subvolInfoLen = 504    // struct btrfs_ioctl_get_subvol_info_args
	// rootSubvolRdonly is the read-only bit of a root item's flags, as
	// GET_SUBVOL_INFO reports them (BTRFS_ROOT_SUBVOL_RDONLY).
	rootSubvolRdonly = 1 << 0

	// firstFreeObjectID is the inode number of every subvolume's root
	// directory (BTRFS_FIRST_FREE_OBJECTID); it is how a subvolume is
	// recognised from a stat.
	firstFreeObjectID = 256
	// lastFreeObjectID bounds ordinary inode numbers; higher object ids in
	// an fs tree are special items (orphans, free-space cache, ...).
	lastFreeObjectID = 0xffffffffffffff00
)

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}

// openDir opens a directory for ioctls without following a final symlink.
func openDir(p string) (int, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: p, Err: err}
	}
	return fd, nil
}

func withDir(p string, fn func(fd int) error) error {
	fd, err := openDir(p)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return fn(fd)
}

func volName(buf []byte, off int, name string) error {
	if name == "" || len(name) >= len(buf)-off || filepath.Base(name) != name || name == "." || name == ".." {
		return fmt.Errorf("subvolume name %q is not a single path component", name)
	}
	copy(buf[off:], name)
	return nil
}

// createSubvolume makes an empty subvolume at p, whose parent directory must
// exist on btrfs.
func createSubvolume(p string) error {
	var args [volArgsSize]byte
	if err := volName(args[:], volNameOff, filepath.Base(p)); err != nil {
		return err
	}
	err := withDir(filepath.Dir(p), func(fd int) error {
		return ioctl(fd, iocSubvolCreate, unsafe.Pointer(&args[0]))
	})
	if err != nil {
		return fmt.Errorf("create subvolume %s: %w", p, err)
	}
	return nil
}

// snapshot makes dst a snapshot of the subvolume src; readOnly makes it a
// read-only one. Creating a snapshot commits a transaction and first flushes
// the source's delayed allocations, so the snapshot holds every write that
// returned before the call.
func snapshot(src, dst string, readOnly bool) error {
	var args [volArgsSize]byte
	if err := volName(args[:], volV2NameOff, filepath.Base(dst)); err != nil {
		return err
	}
	if readOnly {
		binary.NativeEndian.PutUint64(args[16:], subvolRdonly)
	}
	err := withDir(src, func(sfd int) error {
		binary.NativeEndian.PutUint64(args[0:], uint64(sfd))
		return withDir(filepath.Dir(dst), func(dfd int) error {
			return ioctl(dfd, iocSnapCreateV2, unsafe.Pointer(&args[0]))
		})
	})
	if err != nil {
		return fmt.Errorf("snapshot %s to %s: %w", src, dst, err)
	}
	return nil
}

// deleteSubvolume removes the subvolume at p with everything in it. A
// subvolume that does not exist is not an error.
func deleteSubvolume(p string) error {
	var args [volArgsSize]byte
	if err := volName(args[:], volNameOff, filepath.Base(p)); err != nil {
		return err
	}
	err := withDir(filepath.Dir(p), func(fd int) error {
		return ioctl(fd, iocSnapDestroy, unsafe.Pointer(&args[0]))
	})
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete subvolume %s: %w", p, err)
	}
	return nil
}

// setReadOnly sets or clears a subvolume's read-only flag.
func setReadOnly(p string, ro bool) error {
	return withDir(p, func(fd int) error {
		var flags uint64
		if err := ioctl(fd, iocSubvolGetflag, unsafe.Pointer(&flags)); err != nil {
			return fmt.Errorf("subvolume %s: get flags: %w", p, err)
		}
		if ro {
			flags |= subvolRdonly
		} else {
			flags &^= subvolRdonly
		}
		if err := ioctl(fd, iocSubvolSetflag, unsafe.Pointer(&flags)); err != nil {
			return fmt.Errorf("subvolume %s: set flags: %w", p, err)
		}
		return nil
	})
}

// subvolInfo is the part of BTRFS_IOC_GET_SUBVOL_INFO turnsnap uses.
type subvolInfo struct {
	ID         uint64
	Generation uint64 // last transaction that changed the subvolume's tree
	ReadOnly   bool
	UUID       [16]byte
	ParentUUID [16]byte // UUID of the subvolume this one is a snapshot of
	// Ctransid is the transaction of the last change to the subvolume's
	// contents. Unlike Generation, taking a snapshot of the subvolume does
	// not move it.
	Ctransid uint64
	Otransid uint64 // transaction that created it
}

func getSubvolInfo(p string) (subvolInfo, error) {
	var buf [subvolInfoLen]byte
	err := withDir(p, func(fd int) error {
		return ioctl(fd, iocGetSubvolInfo, unsafe.Pointer(&buf[0]))
	})
	if err != nil {
		return subvolInfo{}, fmt.Errorf("subvolume %s: info: %w", p, err)
	}
	ne := binary.NativeEndian
	si := subvolInfo{
		ID: ne.Uint64(buf[0:]), Generation: ne.Uint64(buf[280:]),
		ReadOnly: ne.Uint64(buf[288:])&rootSubvolRdonly != 0,
		Ctransid: ne.Uint64(buf[344:]), Otransid: ne.Uint64(buf[352:]),
	}
	copy(si.UUID[:], buf[296:312])
	copy(si.ParentUUID[:], buf[312:328])
	return si, nil
}

// isSubvolume reports whether p is the root directory of a subvolume.
func isSubvolume(p string) bool {
	var st unix.Stat_t
	return unix.Lstat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR && st.Ino == firstFreeObjectID
}

// startSync starts a commit of the running transaction, if there is one,
// without flushing delayed allocations, and waits for it. It makes inode
// updates that btrfs still holds as delayed items visible to tree searches;
// on an idle filesystem it returns at once.
func startSync(p string) error {
	return withDir(p, func(fd int) error {
		var transid uint64
		if err := ioctl(fd, iocStartSync, unsafe.Pointer(&transid)); err != nil {
			return fmt.Errorf("%s: start sync: %w", p, err)
		}
		if err := ioctl(fd, iocWaitSync, unsafe.Pointer(&transid)); err != nil {
			return fmt.Errorf("%s: wait sync: %w", p, err)
		}
		return nil
	})
}

// syncFS flushes delayed allocations and commits the filesystem holding p.
func syncFS(p string) error {
	return withDir(p, func(fd int) error {
		if err := ioctl(fd, iocSync, nil); err != nil {
			return fmt.Errorf("%s: sync: %w", p, err)
		}
		return nil
	})
}

// inoPaths returns every path of inode ino in the subvolume open as fd.
// BTRFS_IOC_INO_PATHS answers into at most 4 KiB (the kernel caps the
// buffer), so an inode whose names do not fit (a path of about 4 KiB, or
// many links) is resolved from its back references instead.
func inoPaths(fd int, ino uint64) ([]string, error) {
	const size = 4096
	buf := make([]byte, size)
	var args [56]byte
	ne := binary.NativeEndian
	ne.PutUint64(args[0:], ino)
	ne.PutUint64(args[8:], uint64(size))
	ne.PutUint64(args[48:], uint64(uintptr(unsafe.Pointer(&buf[0]))))
	err := ioctl(fd, iocInoPaths, unsafe.Pointer(&args[0]))
	runtime.KeepAlive(buf)
	if err != nil {
		return nil, fmt.Errorf("paths of inode %d: %w", ino, err)
	}
	missing, n := ne.Uint32(buf[4:]), int(ne.Uint32(buf[8:]))
	if missing > 0 || ne.Uint32(buf[12:]) > 0 {
		return refPaths(fd, ino, map[uint64]string{}, 0)
	}
	out := make([]string, 0, n)
	vals := buf[16:]
	for i := range n {
		off := int(ne.Uint64(vals[8*i:]))
		if off < 0 || off >= len(vals) {
			return nil, fmt.Errorf("paths of inode %d: bad offset %d", ino, off)
		}
		s := vals[off:]
		end := 0
		for end < len(s) && s[end] != 0 {
			end++
		}
		out = append(out, string(s[:end]))
	}
	return out, nil
}
