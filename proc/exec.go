package proc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// execGrace is how long a command's stdio may stay open after the command
// exits (a background child it left behind still holding them) before Exec
// stops copying and returns; and how long a cancelled command has between
// SIGTERM and SIGKILL of its runc.
const execGrace = 2 * time.Second

// Exec runs argv in container id to completion and returns its exit status
// (128+N when killed by signal N, as a shell reports it). Its stdin, stdout
// and stderr are streamed from and to the given reader and writers (nil
// means empty input, discarded output). The command's stdio are always
// pipes, even when a caller passes *os.File, so a background process it
// leaves behind never holds a host file (which would make the container
// undumpable). A command that cannot start (no such executable) returns an
// error; the container being absent is ErrNotFound, stopped or paused
// ErrPrecondition. Cancelling ctx sends the command SIGTERM through runc; a
// command that ignores it is left running (runc, not the command, is
// killed execGrace later), so the caller should Delete or kill it.
func (r *Runtime) Exec(ctx context.Context, id string, argv []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if err := r.checkExec(ctx, id, argv); err != nil {
		return -1, err
	}
	logFile, err := os.CreateTemp(workRoot(r.cfg.StateRoot), "exec-"+id+"-*.log")
	if err != nil {
		return -1, fmt.Errorf("container %s: exec: %w", id, err)
	}
	logFile.Close()
	defer os.Remove(logFile.Name())

	args := append([]string{"--root", runcRoot(r.cfg.StateRoot), "--log", logFile.Name(),
		"--log-format", "json", "exec", "--", id}, argv...)
	cmd := exec.CommandContext(ctx, r.cfg.Runc, args...)
	// runc exec forwards SIGTERM to the command; SIGKILL would only kill runc.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = execGrace
	cmd.Stdout, cmd.Stderr = onlyWriter(stdout), onlyWriter(stderr)
	// Our own copy into the command's stdin, not exec.Cmd's: Wait waits
	// for its copy goroutine, which sits in stdin.Read until the caller's
	// input ends, so `sleep 30 | turnsnap exec s -- echo hi` (or a client
	// that never closes its request body) would hang after the command
	// exited. Wait closes this pipe once the command is gone; the copy
	// then ends at the next read.
	if stdin == nil {
		cmd.Stdin = emptyReader{}
	} else {
		w, err := cmd.StdinPipe()
		if err != nil {
			return -1, fmt.Errorf("container %s: exec: %w", id, err)
		}
		go func() {
			io.Copy(w, stdin)
			w.Close()
		}()
	}
	err = cmd.Run()
	if cmd.ProcessState == nil {
		return -1, fmt.Errorf("container %s: exec %s: %w", id, argv[0], err)
	}
	code := cmd.ProcessState.ExitCode()
	if ctx.Err() != nil {
		return code, fmt.Errorf("container %s: exec %s: %w", id, argv[0], ctx.Err())
	}
	if msg := runcLogErrors(logFile.Name()); msg != "" {
		class := errdefs.ErrInvalid
		if strings.Contains(msg, "not found") || strings.Contains(msg, "no such file") {
			class = errdefs.ErrNotFound
		}
		return code, fmt.Errorf("container %s: exec %s: %s: %w", id, argv[0], msg, class)
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) && !errors.Is(err, exec.ErrWaitDelay) {
		return code, fmt.Errorf("container %s: exec %s: %w", id, argv[0], err)
	}
	return code, nil
}

// DetachOptions shape a detached process. The zero value works.
type DetachOptions struct {
	// Log is a path inside the container that receives the process's stdout
	// and stderr (appended); default /dev/null. Its stdin is /dev/null.
	Log string
}

// ExecDetached starts argv in container id as a long-lived process and
// returns its pid inside the container. It is started by a shell that
// exits at once, so it becomes a child of the container's init (a process
// whose parent is outside the container, as `runc exec -d` would make it,
// is silently left out of a dump by CRIU); its stdio point at files inside
// the container (see DetachOptions.Log), never at the host's.
func (r *Runtime) ExecDetached(ctx context.Context, id string, argv []string, opts DetachOptions) (int, error) {
	if err := r.checkExec(ctx, id, argv); err != nil {
		return 0, err
	}
	log := opts.Log
	if log == "" {
		log = "/dev/null"
	}
	// $1 is the log; the rest is argv, passed as words, never re-parsed.
	// A log that cannot be opened fails here (exit 3), not silently in
	// the background child.
	script := `log=$1; shift; true >>"$log" || exit 3; "$@" </dev/null >>"$log" 2>&1 & echo $!`
	var out, errOut capped
	code, err := r.Exec(ctx, id, append([]string{"/bin/sh", "-c", script, "sh", log}, argv...), nil, &out, &errOut)
	if err != nil {
		return 0, err
	}
	if code == 3 {
		// The shell's message names the log ("can't create /x/y.log: ...").
		return 0, fmt.Errorf("container %s: detach %s: --log: %s: %w", id, argv[0], strings.TrimSpace(string(errOut.Bytes())), errdefs.ErrInvalid)
	}
	if code != 0 {
		return 0, fmt.Errorf("container %s: detach %s: shell exited %d: %s", id, argv[0], code, strings.TrimSpace(string(errOut.Bytes())))
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out.Bytes())))
	if err != nil {
		return 0, fmt.Errorf("container %s: detach %s: shell printed %q, not a pid", id, argv[0], out.Bytes())
	}
	return pid, nil
}

// checkExec validates an exec request and that the container runs.
func (r *Runtime) checkExec(ctx context.Context, id string, argv []string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if len(argv) == 0 || argv[0] == "" {
		return fmt.Errorf("container %s: exec: empty command: %w", id, errdefs.ErrInvalid)
	}
	info, err := r.info(id)
	if err != nil {
		return err
	}
	if !info.alive() {
		return fmt.Errorf("container %s: not running: %w", id, errdefs.ErrPrecondition)
	}
	// A command joining a frozen cgroup would freeze at once and hang.
	if info.frozen() {
		return fmt.Errorf("container %s: paused: %w", id, errdefs.ErrPrecondition)
	}
	if ce := lookPath(info, argv[0]); ce != nil {
		return ce
	}
	return nil
}

// runcLogErrors returns the error messages in a runc --log-format json file.
func runcLogErrors(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	var msgs []string
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, `"level":"error"`) && !strings.Contains(line, `"level":"fatal"`) {
			continue
		}
		if m := jsonMsgRe.FindStringSubmatch(line); m != nil {
			msgs = append(msgs, strings.ReplaceAll(m[1], `\n`, "; "))
		}
	}
	return strings.Join(msgs, "; ")
}

// onlyWriter hides a writer's concrete type (an *os.File in particular), so
// exec.Cmd copies through a pipe instead of handing the file to the child.
func onlyWriter(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return struct{ io.Writer }{w}
}

// workDir makes a fresh CRIU work directory for one dump or restore.
func (r *Runtime) workDir(kind, id string) (string, error) {
	d, err := os.MkdirTemp(workRoot(r.cfg.StateRoot), kind+"-"+id+"-")
	if err != nil {
		return "", fmt.Errorf("container %s: %s work dir: %w", id, kind, err)
	}
	return filepath.Clean(d), nil
}
