package proc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Listen opens a TCP listener on the loopback of container id's network
// namespace, served by the caller on the host: the way in for an agent
// that runs inside its sandbox to the daemon's LLM proxy or MCP endpoint,
// which listen on the host's loopback, out of the sandbox's reach
// (docs/PROCESSES.md, "The agent's own processes"). addr must be a
// loopback address (127.0.0.1:PORT, [::1]:PORT; port 0 picks one). The
// listener lives as long as the namespace: a restore gives the container
// a new one, and the route must be opened there again.
func (r *Runtime) Listen(id, addr string) (net.Listener, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	host, _, err := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("container %s: listen on %q: a loopback address is needed", id, addr)
	}
	l, err := ListenInNetns(r.netnsPath(id), addr)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", id, err)
	}
	return l, nil
}

// ListenInNetns makes a TCP listener inside the network namespace pinned
// at path. A socket belongs to the namespace it was made in, whichever
// namespace the thread that serves it is in later, so one thread enters
// the namespace for the socket call only and goes back; if it cannot go
// back it stays locked and dies with its goroutine (see newNetns).
func ListenInNetns(path, addr string) (net.Listener, error) {
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		own, err := unix.Open(fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("own namespace: %w", err)}
			return
		}
		defer unix.Close(own)
		target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("network namespace: %w", err)}
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("network namespace %s: setns: %w", path, err)}
			return
		}
		l, lerr := net.Listen("tcp", addr)
		if err := unix.Setns(own, unix.CLONE_NEWNET); err != nil {
			if l != nil {
				l.Close()
			}
			ch <- result{nil, errors.Join(lerr, fmt.Errorf("back to own network namespace: %w", err))}
			return // locked: the thread ends with this goroutine
		}
		runtime.UnlockOSThread()
		ch <- result{l, lerr}
	}()
	res := <-ch
	return res.l, res.err
}
