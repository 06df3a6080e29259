package catalog

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sessionEnv makes the test binary run session on the catalog it names.
const sessionEnv = "TURNSNAP_CATALOG_TEST_SESSION"

// trapEnv lists the system calls its tracer wants to stop at ("arch:nr,nr,..."),
// see trapCalls.
const trapEnv = "TURNSNAP_CATALOG_TEST_TRAP"

// sessionBlobs is how many blobs each writable session commits.
const sessionBlobs = 2

// session is what TestKilledInsideBadger kills at every step: two writable
// sessions (each: open, commit blobs one per transaction, close), then a
// read-only one, so the kills land in Badger's open after a crash (replay
// and flush of the memtable) and after a clean close, in its commits, and in
// its close. It prints the number of each blob once its commit returned:
// those are the ones that must survive the kill.
func session(dir string) error {
	ctx := context.Background()
	for s := 0; s < 2; s++ {
		c, err := Open(ctx, dir, Options{})
		if err != nil {
			return err
		}
		for i := 100 + s*sessionBlobs; i < 100+(s+1)*sessionBlobs; i++ {
			if err := c.Update(ctx, func(tx *Tx) error { return tx.PutBlob(nthID(i), testBlobLocation()) }); err != nil {
				return err
			}
			fmt.Printf("%d\n", i)
		}
		if err := c.Close(); err != nil {
			return err
		}
	}
	c, err := Open(ctx, dir, Options{ReadOnly: true})
	if err != nil {
		return err
	}
	return c.Close()
}

// trapCalls makes the system calls spec lists ("arch:nr,nr,...", arch an
// AUDIT_ARCH value) stop this process for its tracer (seccomp's
// SECCOMP_RET_TRACE), in every thread, so the tracer need not stop at each of
// the Go runtime's thousands of other calls. An empty spec does nothing.
func trapCalls(spec string) error {
	if spec == "" {
		return nil
	}
	archS, nrs, _ := strings.Cut(spec, ":")
	arch, err := strconv.ParseUint(archS, 0, 32)
	if err != nil {
		return fmt.Errorf("%s %q: %v", trapEnv, spec, err)
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
	// [0] load arch, [1] not ours: allow, [2] load nr, [3..3+n) each nr
	// jumps to the trace return at 3+n+1, [3+n] allow, [3+n+1] trace.
	prog := []unix.SockFilter{
		{Code: ldW, K: arAt},
		{Code: jeq, Jt: 1, Jf: 0, K: uint32(arch)},
		{Code: ret, K: unix.SECCOMP_RET_ALLOW},
		{Code: ldW, K: nrAt},
	}
	for i, s := range list {
		nr, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return fmt.Errorf("%s %q: %v", trapEnv, spec, err)
		}
		prog = append(prog, unix.SockFilter{Code: jeq, Jt: uint8(n - i), K: uint32(nr)})
	}
	prog = append(prog,
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ALLOW},
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_TRACE})
	runtime.LockOSThread() // prctl's no_new_privs is per thread; TSYNC spreads both
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
