package overlay

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Hiding the layers' host paths.
//
// An overlay mounted with mount(2) takes its layers as paths in the option
// string, and /proc/PID/mountinfo shows them to every process that sees the
// mount, the sandbox's own included: `lowerdir=HOME/bases/ID,upperdir=
// HOME/sandboxes/NAME/gen-N/upper,...` names the home, the base and the
// sandbox. The new mount API (fsopen, fsconfig, fsmount, move_mount) takes
// each layer as a file descriptor instead (FSCONFIG_SET_FD, overlayfs on
// Linux 6.15 and later). Each descriptor is the root of a detached clone
// (open_tree(OPEN_TREE_CLONE)) of a layer's directory, a mount in no
// namespace; overlay prints a layer as its path from its own mount's root,
// so mountinfo shows `lowerdir+=/,upperdir=/upper,workdir=/work` and
// nothing of the host. The upper and work dirs come from one clone of the
// generation directory, because overlay wants them on the same mount.
//
// Older kernels refuse a layer descriptor (fsconfig says EINVAL, or the
// fill_super refuses a detached mount) or lack the API (ENOSYS); Mount
// then falls back to mount(2) and the paths show again (docs/SECURITY.md).

// hiddenLayers is what mountinfo lists for the layers of a descriptor mount
// on one lower; hiddenLayersOf gives it for a stack of n lowers.
const hiddenLayers = "lowerdir+=/,upperdir=/upper,workdir=/work"

func hiddenLayersOf(n int) string {
	return strings.Repeat("lowerdir+=/,", n) + "upperdir=/upper,workdir=/work"
}

// mountSource is the overlay's source field in mountinfo: a name derived
// from the upper's host path, which tells turnsnap's own mounts apart (see
// inUseBy) without saying where they are.
func mountSource(upper string) string {
	sum := sha256.Sum256([]byte(upper))
	return "turnsnap-" + hex.EncodeToString(sum[:8])
}

// fdMountUnsupported reports an error of the descriptor path after which
// mount(2) is worth trying: the kernel lacks the API or refuses layer
// descriptors. Every other error (EBUSY, ESTALE, ENOENT ...) is the
// mount's own and mount(2) would fail the same way.
func fdMountUnsupported(err error) bool {
	return errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) ||
		errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EPERM)
}

// mountFD mounts an overlay of lowers (topmost first) under gen's upper
// and work dirs on target with the layers passed as descriptors, and every
// feature option in FeatureOptions.
func mountFD(lowers []string, gen, target string) (err error) {
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	clone := func(path string) (int, error) {
		fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return -1, fmt.Errorf("open_tree %s: %w", path, err)
		}
		fds = append(fds, fd)
		return fd, nil
	}
	sub := func(dir int, name string) (int, error) {
		fd, err := unix.Openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("open %s: %w", name, err)
		}
		fds = append(fds, fd)
		return fd, nil
	}
	var lfds []int
	for _, l := range lowers {
		lfd, err := clone(l)
		if err != nil {
			return err
		}
		lfds = append(lfds, lfd)
	}
	gfd, err := clone(gen)
	if err != nil {
		return err
	}
	ufd, err := sub(gfd, "upper")
	if err != nil {
		return err
	}
	wfd, err := sub(gfd, "work")
	if err != nil {
		return err
	}
	fs, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen: %w", err)
	}
	fds = append(fds, fs)
	set := func(what string, err error) error {
		if err != nil {
			return fmt.Errorf("fsconfig %s: %w%s", what, err, fsLog(fs))
		}
		return nil
	}
	if err := set("source", unix.FsconfigSetString(fs, "source", mountSource(filepath.Join(gen, "upper")))); err != nil {
		return err
	}
	type layer struct {
		key string
		fd  int
	}
	var layers []layer
	for _, lfd := range lfds {
		layers = append(layers, layer{"lowerdir+", lfd})
	}
	for _, l := range append(layers, layer{"upperdir", ufd}, layer{"workdir", wfd}) {
		if err := set(l.key, unix.FsconfigSetFd(fs, l.key, l.fd)); err != nil {
			return err
		}
	}
	for _, o := range strings.Split(FeatureOptions, ",") {
		k, v, _ := strings.Cut(o, "=")
		if err := set(o, unix.FsconfigSetString(fs, k, v)); err != nil {
			return err
		}
	}
	if err := set("create", unix.FsconfigCreate(fs)); err != nil {
		return err
	}
	mfd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("fsmount: %w%s", err, fsLog(fs))
	}
	fds = append(fds, mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount to %s: %w", target, err)
	}
	return nil
}

// fsLog drains the filesystem context's messages (overlay explains there
// why it refused a configuration) for an error; "" when there are none.
func fsLog(fs int) string {
	var msgs []string
	buf := make([]byte, 4096)
	for range 16 { // the kernel keeps at most 8 messages; bounded anyway
		n, err := unix.Read(fs, buf)
		if err != nil || n <= 0 {
			break
		}
		msgs = append(msgs, strings.TrimSpace(string(buf[:n])))
	}
	if len(msgs) == 0 {
		return ""
	}
	return " (kernel: " + strings.Join(msgs, "; ") + ")"
}
