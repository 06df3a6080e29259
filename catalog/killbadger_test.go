//go:build linux && amd64

package catalog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/turnsnap/turnsnap/internal/testenv"
	"golang.org/x/sys/unix"
)

// A turnsnap killed at any point of Badger's open, commit or close leaves a
// catalog the next command opens, read-only (`turnsnap log`) or writable,
// with everything committed before the kill (issue 23: a kill at the unlink
// of a flushed NNNNN.mem, or at a .vlog step, left a catalog every
// read-only command and the first writer failed on).
//
// The kills are real and land at exact points: the session (see session)
// runs under ptrace, and the test counts its system calls that change a file
// in the catalog directory (create, truncate, write, allocate, map, sync,
// unlink, rename) and SIGKILLs it at the entry of the n-th, for every n until
// the session ends on its own. Each state is then opened both ways, on two
// copies: read-only first and then writable, and writable first.
func TestKilledInsideBadger(t *testing.T) {
	// The session starts by recovering a crashed writer's catalog.
	template := filepath.Join(t.TempDir(), "template")
	if err := os.Mkdir(template, 0o700); err != nil {
		t.Fatal(err)
	}
	killedWriter(t, template)
	run := func(kill func(call string) bool) (dir string, calls []string, committed []int) {
		t.Helper()
		dir = filepath.Join(t.TempDir(), "catalog")
		if err := copyDirSparse(template, dir); err != nil {
			t.Fatal(err)
		}
		out, err := os.CreateTemp(t.TempDir(), "committed")
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		calls, err = traceSession(dir, out, kill)
		if errors.Is(err, errNoPtrace) {
			testenv.Missing(t, "ptrace", err.Error())
		}
		if err != nil {
			t.Fatal(err)
		}
		committed = []int{7} // the killed writer's
		b, _ := io.ReadAll(io.NewSectionReader(out, 0, 1<<20))
		for _, f := range strings.Fields(string(b)) {
			i, _ := strconv.Atoi(f)
			committed = append(committed, i)
		}
		return dir, calls, committed
	}
	// A run to the end lists the calls to kill at. Which thread makes a call
	// first varies from run to run (Badger flushes in the background), so a
	// kill point is "the k-th call like this one", not "the n-th call".
	_, calls, committed := run(func(string) bool { return false })
	if len(committed) != 1+2*sessionBlobs {
		t.Fatalf("the session ran to its end but reported %v committed", committed)
	}
	seen := map[string]int{}
	for n, call := range calls {
		seen[call]++
		k := seen[call]
		t.Run(fmt.Sprintf("%03d %s #%d", n+1, call, k), func(t *testing.T) {
			count := 0
			dir, _, committed := run(func(c string) bool {
				if c == call {
					count++
				}
				return count == k
			})
			if count < k {
				t.Logf("this run made %q only %d times: not killed", call, count)
				return
			}
			rw := filepath.Join(t.TempDir(), "catalog")
			if err := copyDirSparse(dir, rw); err != nil {
				t.Fatal(err)
			}
			checkRecovered(t, dir, true, committed)
			checkRecovered(t, rw, false, committed)
		})
	}
	t.Logf("%d kill points: %s", len(calls), strings.Join(calls, "; "))
	// The states the issue names must be among them, or the test proves
	// nothing about them: a flushed memtable truncated to zero but not yet
	// unlinked, and a value log created but not yet sized.
	for _, want := range [][2]string{{"unlink ", ".mem"}, {"ftruncate ", ".vlog to 134217728"}} {
		found := false
		for _, s := range calls {
			found = found || strings.HasPrefix(s, want[0]) && strings.HasSuffix(s, want[1])
		}
		if !found {
			t.Errorf("no kill at %s...%s", want[0], want[1])
		}
	}
}

var errNoPtrace = errors.New("cannot trace a child process")

// traceSession runs session on dir in a child process under ptrace. At the
// entry of each system call that changes a file in dir it asks kill, and
// SIGKILLs the child if kill says so. It returns those calls up to the
// kill, ("ftruncate 00002.mem to 0", say); a session that is not killed
// must exit successfully. The child writes the blobs it committed to out.
func traceSession(dir string, out *os.File, kill func(call string) bool) ([]string, error) {
	// Every ptrace request must come from the thread that is the tracer.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pid, err := syscall.ForkExec(os.Args[0], []string{os.Args[0]}, &syscall.ProcAttr{
		Env:   append(os.Environ(), sessionEnv+"="+dir, trapEnv+"="+trapSpec()),
		Files: []uintptr{^uintptr(0), out.Fd(), os.Stderr.Fd()},
		Sys:   &syscall.SysProcAttr{Ptrace: true, Pdeathsig: syscall.SIGKILL},
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNoPtrace, err)
	}
	var ws syscall.WaitStatus
	// The child stops at its exec.
	if _, err := syscall.Wait4(pid, &ws, syscall.WALL, nil); err != nil || !ws.Stopped() {
		syscall.Kill(pid, syscall.SIGKILL)
		return nil, fmt.Errorf("%w: child at exec: %v %v", errNoPtrace, ws, err)
	}
	if err := syscall.PtraceSetOptions(pid, unix.PTRACE_O_TRACESECCOMP|unix.PTRACE_O_TRACECLONE|unix.PTRACE_O_EXITKILL); err != nil {
		syscall.Kill(pid, syscall.SIGKILL)
		return nil, fmt.Errorf("%w: %v", errNoPtrace, err)
	}
	if err := syscall.PtraceCont(pid, 0); err != nil {
		syscall.Kill(pid, syscall.SIGKILL)
		return nil, err
	}
	var calls []string
	killed := false
	for {
		tid, err := syscall.Wait4(-1, &ws, syscall.WALL, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return calls, fmt.Errorf("wait: %v", err)
		}
		if ws.Exited() || ws.Signaled() {
			if tid != pid {
				continue // one of its threads
			}
			if killed || ws.Exited() && ws.ExitStatus() == 0 {
				return calls, nil
			}
			return calls, fmt.Errorf("session ended with %v after %d catalog calls", ws, len(calls))
		}
		if !ws.Stopped() {
			continue
		}
		sig := ws.StopSignal()
		switch {
		case sig == syscall.SIGTRAP && ws.TrapCause() == unix.PTRACE_EVENT_SECCOMP:
			// The entry of one of the calls trapSpec lists.
			if !killed {
				if call := catalogCall(pid, tid, dir); call != "" {
					calls = append(calls, call)
					if kill(call) {
						// The call has not run: the catalog is as it was just
						// before it. SIGKILL ends even a stopped tracee.
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

// trapSpec is trapEnv's value: the calls catalogCall looks at.
func trapSpec() string {
	nrs := []string{}
	for _, nr := range []int{syscall.SYS_OPENAT, syscall.SYS_UNLINKAT, syscall.SYS_RENAMEAT, unix.SYS_RENAMEAT2,
		syscall.SYS_FTRUNCATE, syscall.SYS_FALLOCATE, syscall.SYS_WRITE, syscall.SYS_PWRITE64,
		syscall.SYS_MMAP, syscall.SYS_MSYNC} {
		nrs = append(nrs, strconv.Itoa(nr))
	}
	return fmt.Sprintf("%#x:%s", unix.AUDIT_ARCH_X86_64, strings.Join(nrs, ","))
}

// catalogCall describes the system call thread tid is entering if it
// changes a file in dir, or returns "".
func catalogCall(pid, tid int, dir string) string {
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
		// Only Badger calls msync: it has written its mapping (a WAL entry,
		// a new log's header) and is about to sync it.
		return "msync"
	default:
		return ""
	}
	if name == "" {
		return ""
	}
	return strings.TrimSpace(fmt.Sprintf("%s %s %s", call, name, detail))
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

// copyDirSparse copies the regular files of src into a new directory dst,
// keeping their holes: Badger's logs are sparse files of 32 and 128 MiB
// holding a few KB.
func copyDirSparse(src, dst string) error {
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		if err := copyFileSparse(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func copyFileSparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
	if err != nil {
		return err
	}
	defer out.Close()
	for off := int64(0); off < fi.Size(); {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if _, err := io.Copy(io.NewOffsetWriter(out, data), io.NewSectionReader(in, data, hole-data)); err != nil {
			return err
		}
		off = hole
	}
	if err := out.Truncate(fi.Size()); err != nil {
		return err
	}
	return out.Close()
}
