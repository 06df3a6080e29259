package procs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/proc"
)

// ExecOptions configures Exec.
type ExecOptions struct {
	Detach bool `json:"detach,omitempty"` // start a long-lived process and return at once
	// Log is an absolute path inside the sandbox that receives a detached
	// process's stdout and stderr (appended; its directory must exist);
	// empty means /dev/null.
	Log    string    `json:"log,omitempty"`
	Stdin  io.Reader `json:"-"`
	Stdout io.Writer `json:"-"`
	Stderr io.Writer `json:"-"`
}

// CommandError is a command that cannot run in the sandbox: Code 127 when
// it is not found, 126 when it is not executable (a shell's codes).
type CommandError = proc.CommandError

// Exec runs argv inside the sandbox's container, starting the container
// on first use. It returns the command's exit code, or for Detach the
// process's pid inside the sandbox. A command that cannot run is a
// *CommandError.
func (m *Manager) Exec(ctx context.Context, name delta.SandboxName, argv []string, opts ExecOptions) (int, error) {
	run, err := m.PrepareExec(ctx, name)
	if err != nil {
		return 0, err
	}
	return run(ctx, argv, opts)
}

// ExecFunc runs one command in a prepared sandbox container.
type ExecFunc func(ctx context.Context, argv []string, opts ExecOptions) (int, error)

// PrepareExec mounts the sandbox and starts its container if needed, and
// returns a function that runs commands in it without the engine: the CLI
// closes the engine (freeing the home for other turnsnap commands) before a
// long command runs. A checkpoint taken while such a command still runs is
// refused by the process layer (its parent is outside the container).
func (m *Manager) PrepareExec(ctx context.Context, name delta.SandboxName) (ExecFunc, error) {
	// The preparation (finishing an interrupted rollback, starting the
	// container) is an operation on the sandbox like any other; the
	// command itself runs outside the lock.
	st, done, err := m.d.Load(ctx, name, true)
	if err != nil {
		return nil, err
	}
	defer done()
	if lost := st.Interrupted; lost != nil && lost.ProcessesLost != "" {
		m.d.Log.Warn("the sandbox's processes were not restored", "sandbox", name, "why", lost.ProcessesLost)
	}
	if err := st.Root.Mount(ctx); err != nil {
		return nil, err
	}
	rt, err := m.Runtime(ctx)
	if err != nil {
		return nil, err
	}
	c := m.Container(name)
	running, err := m.Running(ctx, c)
	if err != nil {
		return nil, err
	}
	id := c.ID
	if running {
		if fs, err := rt.Freeze(id); err == nil && fs.Frozen {
			return nil, fmt.Errorf("sandbox %s: its container is frozen by %s (a checkpoint in progress?); wait, or thaw it with `turnsnap sandbox resume %s`: %w",
				name, freezeHolder(fs), name, errdefs.ErrPrecondition)
		}
	}
	if !running {
		rt.Delete(ctx, id) // a stopped leftover, if any
		if err := rt.Start(ctx, id, st.Root.Path(), proc.StartOptions{}); err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", name, err)
		}
	}
	return func(ctx context.Context, argv []string, opts ExecOptions) (int, error) {
		if len(argv) == 0 {
			return 0, fmt.Errorf("sandbox %s: exec needs a command: %w", name, errdefs.ErrInvalid)
		}
		if opts.Log != "" && (!filepath.IsAbs(opts.Log) || filepath.Clean(opts.Log) != opts.Log || strings.ContainsRune(opts.Log, 0)) {
			return 0, fmt.Errorf("sandbox %s: --log %q: want a clean absolute path inside the sandbox: %w", name, opts.Log, errdefs.ErrInvalid)
		}
		defer m.watchFreeze(ctx, name, rt)() // no exec waits on a freeze nobody holds
		run := func() (int, error) {
			if opts.Detach {
				return rt.ExecDetached(ctx, id, argv, proc.DetachOptions{Log: opts.Log})
			}
			in := opts.Stdin
			if in == nil {
				in = eofReader{}
			}
			return rt.Exec(ctx, id, argv, in, orDiscard(opts.Stdout), orDiscard(opts.Stderr))
		}
		code, err := run()
		if err != nil && strings.Contains(err.Error(), "paused") {
			// Frozen after the check above, before runc started the
			// command (runc refused it, nothing ran): by a freeze nobody
			// holds, thawed now, and the command is run once more.
			if thawed, rerr := m.recoverFreeze(ctx, name); rerr == nil && thawed {
				code, err = run()
			}
		}
		return code, nameCommandError(name, err)
	}, nil
}

// nameCommandError says which sandbox a command was not found in; the
// runtime's other errors name the container (ts-SCOPE-NAME) already.
func nameCommandError(sandbox delta.SandboxName, err error) error {
	var ce *CommandError
	if errors.As(err, &ce) {
		return fmt.Errorf("sandbox %s: %w", sandbox, err)
	}
	return err
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
