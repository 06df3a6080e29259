// Package killpoint SIGKILLs a test's child process at an exact system call:
// Run starts the child under ptrace, stops it at the entry of each call that
// changes a file in a directory (create, truncate, write, allocate, shared
// writable map, msync, unlink, rename), names the call ("ftruncate
// 00002.mem to 0") and kills the child there when the test says so. The call
// has not run, so the directory is exactly as a kill just before it leaves
// it. Crash tests use it to reach the intermediate states of a store's
// open and close (Badger's, for the catalog) that a kill at a random moment
// almost never hits.
//
// The child must call Trap first thing (it reads its spec from TrapEnv,
// which Run sets): a seccomp filter then stops only the calls of interest,
// not each of the Go runtime's thousands of others. Processes the child
// starts inherit the filter without the tracer, and those calls then fail
// in them with ENOSYS: trace a child that starts no other program.
package killpoint

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TrapEnv carries the calls Run wants stopped ("arch:nr,nr,...") to the
// child's Trap.
const TrapEnv = "TURNSNAP_KILLPOINT_TRAP"

// ErrUnsupported is Run's error where it cannot trace: another
// architecture, or ptrace or seccomp refused (a sandbox, a container).
var ErrUnsupported = errors.New("cannot trace a child process here")

// Trap, in the child, makes the system calls spec lists (TrapEnv's value)
// stop this process for its tracer (seccomp's SECCOMP_RET_TRACE), in every
// thread. An empty spec (not run by Run) does nothing.
func Trap(spec string) error {
	if spec == "" {
		return nil
	}
	archS, nrs, _ := strings.Cut(spec, ":")
	arch, err := strconv.ParseUint(archS, 0, 32)
	if err != nil {
		return fmt.Errorf("%s %q: %v", TrapEnv, spec, err)
	}
	const (
		ldW  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		ret  = unix.BPF_RET | unix.BPF_K
		nrAt = 0 // offsetof(struct seccomp_data, nr)
		arAt = 4 // offsetof(struct seccomp_data, arch)
	)
	list := strings.Split(nrs, ",")
	n := len(list)
	// [0] load arch, [1] ours: skip [2], [2] allow, [3] load nr,
	// [4, 4+n) each nr jumps to [4+n+1] (trace), [4+n] allow.
	prog := []unix.SockFilter{
		{Code: ldW, K: arAt},
		{Code: jeq, Jt: 1, Jf: 0, K: uint32(arch)},
		{Code: ret, K: unix.SECCOMP_RET_ALLOW},
		{Code: ldW, K: nrAt},
	}
	for i, s := range list {
		nr, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return fmt.Errorf("%s %q: %v", TrapEnv, spec, err)
		}
		prog = append(prog, unix.SockFilter{Code: jeq, Jt: uint8(n - i), K: uint32(nr)})
	}
	prog = append(prog,
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ALLOW},
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_TRACE})
	runtime.LockOSThread() // no_new_privs is per thread; TSYNC spreads it with the filter
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog))); errno != 0 {
		return fmt.Errorf("seccomp filter: %w", errno)
	}
	return nil
}
