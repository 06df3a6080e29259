package delta

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// sandboxDevices are the device nodes a sandbox may keep in its checkpoints:
// the pseudo devices every container gets in its /dev (null, zero, full,
// random, urandom, tty, ptmx). Opening one grants nothing, on the host or
// in any container, so recording and restoring them is safe; agents make
// them when they build a chroot or an image (debootstrap, mkosi).
var sandboxDevices = map[[3]uint32]string{
	{unix.S_IFCHR, 1, 3}: "null", {unix.S_IFCHR, 1, 5}: "zero", {unix.S_IFCHR, 1, 7}: "full",
	{unix.S_IFCHR, 1, 8}: "random", {unix.S_IFCHR, 1, 9}: "urandom",
	{unix.S_IFCHR, 5, 0}: "tty", {unix.S_IFCHR, 5, 2}: "ptmx",
}

// CheckDevice is the one rule for device nodes in a sandbox's own layer,
// applied alike when a checkpoint is taken (the engine checks every tree a
// scan saves), when it is verified, and when it is restored (fstree.Materialise,
// ApplyLayer): the pseudo devices of sandboxDevices pass; any other
// character or block device is refused with ErrPrecondition, because
// restoring it would put a working device node on the host, from data that
// may come from a remote store. runc lets a container mknod any device
// number (it may not open it), so the refusal at checkpoint time says what
// to do. Entries of other types always pass. Bases, the operator's own
// images, are not checked (fstree.ApplyOptions.AllowDevices).
func CheckDevice(e Entry) error {
	var kind uint32
	switch e.Type {
	case TypeCharDev:
		kind = unix.S_IFCHR
	case TypeBlockDev:
		kind = unix.S_IFBLK
	default:
		return nil
	}
	maj, min := unix.Major(e.Rdev), unix.Minor(e.Rdev)
	if _, ok := sandboxDevices[[3]uint32{kind, maj, min}]; ok {
		return nil
	}
	what := "character"
	if kind == unix.S_IFBLK {
		what = "block"
	}
	return fmt.Errorf("%s is a %s device node %d:%d; a sandbox's checkpoints keep only the pseudo devices null, zero, full, random, urandom, tty and ptmx: remove it (or put it in the base): %w",
		e.Name, what, maj, min, errdefs.ErrPrecondition)
}
