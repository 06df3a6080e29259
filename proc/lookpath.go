package proc

import (
	"bytes"
	"fmt"
	"os"
	"path"
	"strings"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

// CommandError is a command that cannot run in the container: not found
// (Code 127) or found but not executable (126), the codes a shell uses.
// It is found before runc runs, so the caller reports it once, in its own
// words, instead of runc's message on the command's stderr and again as an
// error.
type CommandError struct {
	Container string
	Name      string
	Code      int    // 127 or 126
	Reason    string // "command not found", "permission denied", "is a directory"
}

func (e *CommandError) Error() string { return e.Name + ": " + e.Reason }

// Unwrap classes the error: a missing command is not found, an
// unexecutable one a failed precondition.
func (e *CommandError) Unwrap() error {
	if e.Code == 127 {
		return errdefs.ErrNotFound
	}
	return errdefs.ErrPrecondition
}

// defaultPath is the PATH of a container whose init has none (spec.go).
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// lookPath resolves argv0 as the container's exec would: inside the root of
// its init (openat2 RESOLVE_IN_ROOT, so no symlink of the sandbox's reaches
// the host), along the init's PATH unless argv0 has a slash, and checks it
// is an executable regular file. Anything it cannot decide (the init gone,
// /proc unreadable) is left to runc.
func lookPath(ci containerInfo, argv0 string) *CommandError {
	rootFD, err := unix.Open(fmt.Sprintf("/proc/%d/root", ci.InitPID), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(rootFD)
	cands := []string{argv0}
	if !strings.Contains(argv0, "/") {
		cands = nil
		for _, dir := range strings.Split(initPath(ci.InitPID), ":") {
			if dir == "" {
				dir = "."
			}
			cands = append(cands, path.Join(dir, argv0))
		}
	}
	var found *CommandError
	for _, c := range cands {
		if !path.IsAbs(c) {
			c = "/" + c // the container's cwd is its root
		}
		fd, err := unix.Openat2(rootFD, c, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
		if err != nil {
			continue
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		switch {
		case err != nil:
			continue
		case st.Mode&unix.S_IFMT == unix.S_IFDIR:
			found = &CommandError{Name: argv0, Code: 126, Reason: "is a directory"}
		case st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o111 == 0:
			found = &CommandError{Name: argv0, Code: 126, Reason: "permission denied (not an executable file)"}
		default:
			return nil
		}
	}
	if found == nil {
		found = &CommandError{Name: argv0, Code: 127, Reason: "command not found"}
		if strings.Contains(argv0, "/") {
			found.Reason = "no such file"
		}
	}
	found.Container = ci.ID
	return found
}

// initPath is the PATH in the environment of the container's init, which
// every exec inherits from the spec.
func initPath(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return defaultPath
	}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("PATH=")); ok {
			return string(v)
		}
	}
	return defaultPath
}
