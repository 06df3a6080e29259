package killpoint

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Run starts argv (env added to the environment, files as its fds 0, 1, 2...)
// under ptrace and, at the entry of each system call it makes that changes a
// file in dir (absolute), asks kill with the call's description, SIGKILLing
// the child if kill says so. It returns those calls up to the kill; a child
// not killed must exit 0. Canceling ctx kills the child.
func Run(ctx context.Context, argv, env []string, files []*os.File, dir string, kill func(call string) bool) ([]string, error) {
	// Every ptrace request must come from the thread that is the tracer.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	fds := make([]uintptr, len(files))
	for i, f := range files {
		fds[i] = ^uintptr(0) // closed in the child
		if f != nil {
			fds[i] = f.Fd()
		}
	}
	pid, err := syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{
		Env:   append(append(os.Environ(), env...), TrapEnv+"="+trapSpec()),
		Files: fds,
		Sys:   &syscall.SysProcAttr{Ptrace: true, Pdeathsig: syscall.SIGKILL},
	})
	if err != nil {
		return nil, fmt.Errorf("%w: start %s: %v", ErrUnsupported, argv[0], err)
	}
	stop := context.AfterFunc(ctx, func() { syscall.Kill(pid, syscall.SIGKILL) })
	defer stop()
	var ws syscall.WaitStatus
	// The child stops at its exec.
	if _, err := syscall.Wait4(pid, &ws, syscall.WALL, nil); err != nil || !ws.Stopped() {
		syscall.Kill(pid, syscall.SIGKILL)
		return nil, fmt.Errorf("%w: child at exec: %v %v", ErrUnsupported, ws, err)
	}
	if err := syscall.PtraceSetOptions(pid, unix.PTRACE_O_TRACESECCOMP|unix.PTRACE_O_TRACECLONE|unix.PTRACE_O_EXITKILL); err != nil {
		syscall.Kill(pid, syscall.SIGKILL)
		return nil, fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	if err := syscall.PtraceCont(pid, 0); err != nil {
		syscall.Kill(pid, syscall.SIGKILL)
		return nil, err
	}
	var calls []string
	killed := false
	for {
		// Every thread of the child reports here (WALL); the test process
		// must have no other child being waited for meanwhile.
		tid, err := syscall.Wait4(-1, &ws, syscall.WALL, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return calls, fmt.Errorf("wait for %s: %v", argv[0], err)
		}
		if ws.Exited() || ws.Signaled() {
			if tid != pid {
				continue // one of its threads
			}
			if err := ctx.Err(); err != nil {
				return calls, err
			}
			if killed || ws.Exited() && ws.ExitStatus() == 0 {
				return calls, nil
			}
			return calls, fmt.Errorf("%s ended with %v after %d calls in %s", argv[0], ws, len(calls), dir)
		}
		if !ws.Stopped() {
			continue
		}
		sig := ws.StopSignal()
		switch {
		case sig == syscall.SIGTRAP && ws.TrapCause() == unix.PTRACE_EVENT_SECCOMP:
			// The entry of one of the calls trapSpec lists.
			if !killed {
				if call := describe(pid, tid, dir); call != "" {
					calls = append(calls, call)
					if kill(call) {
						// The call has not run. SIGKILL ends even a
						// stopped tracee.
						killed = true
						syscall.Kill(pid, syscall.SIGKILL)
						continue
					}
				}
			}
			sig = 0
		case sig == syscall.SIGTRAP, sig == syscall.SIGSTOP:
			// A clone event, or a new thread's first stop: not the
			// program's signals.
			sig = 0
		}
		syscall.PtraceCont(tid, int(sig)) // ESRCH once killed: nothing to do
	}
}

// trapSpec is TrapEnv's value: the calls describe looks at.
func trapSpec() string {
	nrs := []string{}
	for _, nr := range []int{syscall.SYS_OPENAT, syscall.SYS_UNLINKAT, syscall.SYS_RENAMEAT, unix.SYS_RENAMEAT2,
		syscall.SYS_FTRUNCATE, syscall.SYS_FALLOCATE, syscall.SYS_WRITE, syscall.SYS_PWRITE64,
		syscall.SYS_MMAP, syscall.SYS_MSYNC} {
		nrs = append(nrs, strconv.Itoa(nr))
	}
	return fmt.Sprintf("%#x:%s", unix.AUDIT_ARCH_X86_64, strings.Join(nrs, ","))
}

// describe names the system call thread tid is entering if it changes a
// file in dir (relative to dir), or returns "".
func describe(pid, tid int, dir string) string {
	var r syscall.PtraceRegs
	if err := syscall.PtraceGetRegs(tid, &r); err != nil {
		return ""
	}
	fdName := func(fd uint64) string {
		p, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, int32(fd)))
		if err != nil || !strings.HasPrefix(p, dir+"/") {
			return ""
		}
		return strings.TrimPrefix(p, dir+"/")
	}
	pathName := func(addr uint64) string {
		p := peekString(tid, addr)
		if !strings.HasPrefix(p, dir+"/") {
			return ""
		}
		return strings.TrimPrefix(p, dir+"/")
	}
	var call, name, detail string
	switch r.Orig_rax {
	case syscall.SYS_OPENAT:
		if r.Rdx&(syscall.O_CREAT|syscall.O_TRUNC) == 0 {
			return ""
		}
		call, name = "create", pathName(r.Rsi)
	case syscall.SYS_UNLINKAT:
		call, name = "unlink", pathName(r.Rsi)
	case syscall.SYS_RENAMEAT, unix.SYS_RENAMEAT2:
		call, name, detail = "rename", pathName(r.Rsi), "to "+pathName(r.R10)
	case syscall.SYS_FTRUNCATE:
		call, name, detail = "ftruncate", fdName(r.Rdi), fmt.Sprintf("to %d", r.Rsi)
	case syscall.SYS_FALLOCATE:
		call, name = "fallocate", fdName(r.Rdi)
	case syscall.SYS_WRITE, syscall.SYS_PWRITE64:
		call, name = "write", fdName(r.Rdi)
	case syscall.SYS_MMAP:
		if r.R10&syscall.MAP_SHARED == 0 || r.Rdx&syscall.PROT_WRITE == 0 {
			return ""
		}
		call, name = "mmap", fdName(r.R8)
	case syscall.SYS_MSYNC:
		// No file to name: the address is in a shared mapping, written
		// (a log entry, a new file's header) and about to be synced.
		return "msync"
	default:
		return ""
	}
	if name == "" {
		return ""
	}
	return strings.TrimSpace(call + " " + name + " " + detail)
}

// peekString reads the NUL-terminated string at addr in thread tid.
func peekString(tid int, addr uint64) string {
	var s []byte
	chunk := make([]byte, 64)
	for len(s) < 4096 {
		n, err := syscall.PtracePeekData(tid, uintptr(addr)+uintptr(len(s)), chunk)
		if i := bytes.IndexByte(chunk[:n], 0); i >= 0 {
			return string(append(s, chunk[:i]...))
		}
		s = append(s, chunk[:n]...)
		if err != nil || n == 0 {
			break
		}
	}
	return string(s)
}
