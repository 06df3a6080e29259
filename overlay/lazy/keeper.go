package lazy

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A keeper is a process that does nothing but hold a duplicate of the
// group's descriptor, so the group outlives a killed daemon. Measured here:
// when the last descriptor of a pre-content group closes, every access
// waiting on it proceeds and reads the placeholder's holes. With a keeper,
// an access that comes while no daemon runs waits instead; the next daemon
// takes the group back from the keeper (pidfd_getfd) and answers new
// events. Events the dead daemon had read but not answered cannot be
// answered again (they are matched by its descriptor numbers): they are
// let through when the group finally closes, which the new daemon does
// only once every file is filled, so they read the filled bytes too.

// keeperFD is the group's descriptor number in the keeper.
const keeperFD = 3

// keeper is a running keeper: its pidfd (to signal it without a pid
// reuse race) and, when this process started it, its command (to reap it).
type keeper struct {
	pid   int
	pidfd int
	cmd   *exec.Cmd
}

// startKeeper starts a keeper holding a duplicate of gfd: `sleep infinity`
// in a session of its own, so a signal to the daemon's process group does
// not take it along.
func startKeeper(gfd int) (*keeper, error) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		return nil, fmt.Errorf("keeper: %w", err)
	}
	dup, err := unix.FcntlInt(uintptr(gfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("keeper: %w", err)
	}
	f := os.NewFile(uintptr(dup), "fanotify-group")
	defer f.Close()
	cmd := exec.Command(sleep, "infinity")
	cmd.ExtraFiles = []*os.File{f} // descriptor 3 (keeperFD)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("keeper: %w", err)
	}
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("keeper: %w", err)
	}
	return &keeper{pid: cmd.Process.Pid, pidfd: pidfd, cmd: cmd}, nil
}

// adoptKeeper takes the group back from the keeper pid a dead process
// recorded: it must still be a process whose descriptor keeperFD is a
// fanotify group (else the pid was reused, and nothing is touched). It
// returns the keeper and a descriptor of the group.
func adoptKeeper(pid int) (*keeper, int, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, -1, fmt.Errorf("keeper %d: %w", pid, err)
	}
	// Checked after the pidfd is open: from here on pid is that process.
	link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, keeperFD))
	if err != nil || link != "anon_inode:[fanotify]" {
		unix.Close(pidfd)
		return nil, -1, fmt.Errorf("keeper %d: descriptor %d is %q, not a fanotify group: %w", pid, keeperFD, link, errors.Join(err, os.ErrNotExist))
	}
	if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) != "sleep" {
		unix.Close(pidfd)
		return nil, -1, fmt.Errorf("keeper %d: not a keeper (%q): %w", pid, strings.TrimSpace(string(comm)), os.ErrNotExist)
	}
	fd, err := unix.PidfdGetfd(pidfd, keeperFD, 0)
	if err != nil {
		unix.Close(pidfd)
		return nil, -1, fmt.Errorf("keeper %d: take its group: %w", pid, err)
	}
	return &keeper{pid: pid, pidfd: pidfd}, fd, nil
}

// stop ends the keeper (its duplicate of the group closes with it).
func (k *keeper) stop() {
	_ = unix.PidfdSendSignal(k.pidfd, unix.SIGKILL, nil, 0)
	if k.cmd != nil {
		_ = k.cmd.Wait()
	} else {
		// Not our child: wait until it is gone, so the group is released
		// when the caller closes its own descriptors.
		fds := []unix.PollFd{{Fd: int32(k.pidfd), Events: unix.POLLIN}}
		_, _ = unix.Poll(fds, 5000)
	}
	unix.Close(k.pidfd)
}

// Release stops the keeper a root's state file in dir names, if it is
// still a keeper: removing a root whose restore no process runs must not
// leave its keeper holding a group of deleted files.
func Release(dir string) error {
	st, err := ReadState(dir)
	if err != nil || st.Keeper == 0 {
		return err
	}
	k, fd, err := adoptKeeper(st.Keeper)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			return nil // gone, or not ours
		}
		return err
	}
	k.stop()
	return unix.Close(fd)
}
