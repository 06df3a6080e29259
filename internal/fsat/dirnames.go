package fsat

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// DirBufSize is the getdents buffer ReadDirNames uses: about 300 names of
// a typical length per call.
const DirBufSize = 8 << 10

// ReadDirNames lists the open directory fd (from its start) without
// stat-ing its entries. fd stays open and owned by the caller. It reads
// with getdents64 directly: an os.File around the descriptor cost a
// poller registration, a close and a buffer per call, which the scans and
// a rollback's Verify pay per directory.
func ReadDirNames(fd int) ([]string, error) {
	names := make([]string, 0, 16)
	err := EachDirName(fd, make([]byte, DirBufSize), func(name []byte) error {
		names = append(names, string(name))
		return nil
	})
	return names, err
}

// EachDirName calls fn with each name of the open directory fd (from its
// start; "." and ".." left out), read into buf (at least a page); name is
// valid only during the call. fd stays open and owned by the caller, its
// offset untouched. An error from fn stops the listing and is returned.
func EachDirName(fd int, buf []byte, fn func(name []byte) error) error {
	dup, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dup)
	for {
		n, err := unix.Getdents(dup, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n <= 0 {
			return nil
		}
		if err := eachDirent(buf[:n], fn); err != nil {
			return err
		}
	}
}

// eachDirent walks the linux_dirent64 records in b: d_ino (8 bytes),
// d_off (8), d_reclen (2), d_type (1), then the NUL-terminated name.
func eachDirent(b []byte, fn func(name []byte) error) error {
	const nameOff = 19
	for len(b) > 0 {
		if len(b) < nameOff {
			return fmt.Errorf("getdents: a record of %d bytes", len(b))
		}
		reclen := int(binary.NativeEndian.Uint16(b[16:18]))
		if reclen < nameOff || reclen > len(b) {
			return fmt.Errorf("getdents: a record length of %d in %d bytes", reclen, len(b))
		}
		name := b[nameOff:reclen]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		b = b[reclen:]
		if len(name) == 0 || string(name) == "." || string(name) == ".." {
			continue
		}
		if err := fn(name); err != nil {
			return err
		}
	}
	return nil
}
