package proc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// Every container joins a network namespace that turnsnap creates and pins
// with a bind mount at <state root>/netns/<id>, rather than one runc creates
// and owns. runc checkpoints a container whose network namespace has a path
// as external to the image (CRIU's --external net[INO]), and on restore
// hands CRIU the new container's namespace to put the processes in. That
// namespace already has its loopback up when CRIU recreates the sockets, so
// listening sockets answer at once and established loopback connections
// (a dev server and its database) reconnect under TCP repair. A namespace
// runc creates would be restored empty (runc marks the network "empty" for
// CRIU) with loopback down, and "Can't connect inet socket back: Network is
// unreachable" ends the restore of any established connection.

func netnsDir(root string) string             { return filepath.Join(root, "netns") }
func (r *Runtime) netnsPath(id string) string { return filepath.Join(netnsDir(r.cfg.StateRoot), id) }

// newNetns creates a network namespace holding only loopback, up, and pins
// it at path (which must not exist).
func newNetns(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o600)
	if err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		// The thread enters the new namespace and goes back to its own
		// once the new one is pinned; only then is it unlocked for other
		// goroutines. If it cannot go back it stays locked, and the Go
		// runtime ends it with this goroutine (or, if it is the main
		// thread, parks it for ever: a thread left in a sandbox's
		// namespace would keep that namespace alive and make
		// /proc/PID/ns/net of turnsnap name it).
		runtime.LockOSThread()
		orig, err := unix.Open(fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("own namespace: %w", err)
			runtime.UnlockOSThread()
			return
		}
		defer unix.Close(orig)
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				runtime.UnlockOSThread() // still in its own namespace
				return fmt.Errorf("unshare: %w", err)
			}
			defer func() {
				if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
					runtime.UnlockOSThread()
				}
			}()
			if err := loopbackUp(); err != nil {
				return err
			}
			self := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
			if err := unix.Mount(self, path, "", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("pin at %s: %w", path, err)
			}
			return nil
		}()
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return fmt.Errorf("network namespace: %w", err)
	}
	return nil
}

// removeNetns unpins the namespace at path (the kernel frees it once no
// process is in it) and removes the file. A missing one is not an error.
func removeNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil &&
		!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("network namespace %s: unmount: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("network namespace %s: %w", path, err)
	}
	return nil
}

// loopbackUp sets lo up in the calling thread's network namespace; the
// kernel gives it 127.0.0.1 and ::1 as it comes up.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	return nil
}
