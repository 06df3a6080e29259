package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// commandExit carries a sandboxed command's exit status out of cobra, so
// `turnsnap exec` exits with it and prints nothing of its own.
type commandExit struct{ code int }

func (c commandExit) Error() string { return fmt.Sprintf("command exited with status %d", c.code) }

func (a *app) execCmd() *cobra.Command {
	var detach bool
	var logPath string
	c := &cobra.Command{
		Use:   "exec NAME [--detach [--log PATH]] -- CMD [ARGS...]",
		Short: "Run a command inside the sandbox (its container starts on first use)",
		Long: `exec runs CMD in the sandbox's container (runc, the sandbox root as its root,
its own pid, mount, ipc, uts and network namespaces) with stdin, stdout and
stderr streamed through pipes, and exits with CMD's exit status. A CMD that
does not exist in the sandbox exits 127, one that is not executable 126
(as a shell does), with one message saying so.

--detach starts a long-lived process (a dev server, a database), prints its
pid inside the sandbox and returns at once. Its output goes to --log PATH,
an absolute path inside the sandbox whose directory exists (appended;
default /dev/null). 'turnsnap ps NAME' lists such processes. Processes alive at a turn's end are
checkpointed with CRIU by the next 'turnsnap checkpoint'. The turnsnap home
is free while CMD runs; a checkpoint taken meanwhile is refused until it ends.`,
		Args: cobra.MinimumNArgs(2),
	}
	c.RunE = a.withEngine(func(ctx context.Context, e *engine.Engine, args []string) error {
		run, err := e.PrepareExec(ctx, args[0])
		if err != nil {
			return err
		}
		// Free the home while the command runs: an agent's test suite must
		// not block `turnsnap status` or `log` from another terminal.
		if err := e.Close(); err != nil {
			return err
		}
		if logPath != "" && !detach {
			return fmt.Errorf("exec: --log needs --detach (a command in the foreground streams its output): %w", errdefs.ErrInvalid)
		}
		code, err := run(ctx, args[1:], engine.ExecOptions{
			Detach: detach, Log: logPath, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		})
		if err != nil {
			return err
		}
		if detach {
			if a.json {
				return printJSON(a.stdout(), map[string]any{"sandbox": args[0], "started": args[1:], "pid": code, "log": logPath})
			}
			fmt.Fprintln(a.stdout(), code)
			return nil
		}
		if code != 0 {
			return commandExit{code}
		}
		return nil
	})
	c.Flags().BoolVarP(&detach, "detach", "d", false, "start a long-lived process, print its pid and return at once")
	c.Flags().StringVar(&logPath, "log", "", "with --detach: absolute path inside the sandbox for the process's stdout and stderr")
	return c
}

func (a *app) psCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "ps NAME",
		Short: "List the sandbox's long-lived processes and whether the head checkpoint holds them",
		Long: `ps lists the long-lived processes of the sandbox's container (its own idle
init left out): pid inside the sandbox, when it started, its command, and
whether the head checkpoint's process image holds it (yes: a rollback to
the head brings it back; no: it started, or was restarted, since, and the
next checkpoint will dump it).`,
		Args: cobra.ExactArgs(1),
	}
	c.RunE = a.readOnly(func(ctx context.Context, e *engine.Engine, args []string) error {
		l, err := e.Processes(ctx, args[0], engine.ProcessesOptions{})
		if err != nil {
			return err
		}
		if a.json {
			return printJSON(a.stdout(), l)
		}
		if !l.Running {
			fmt.Fprintf(a.stdout(), "sandbox %s: no container running\n", l.Sandbox)
			return nil
		}
		tw := tabwriter.NewWriter(a.stdout(), 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "PID\tSTARTED\tIN CHECKPOINT\tCOMMAND")
		for _, p := range l.Processes {
			in := "no"
			if p.InCheckpoint {
				in = "yes (" + l.Head.Short() + ")"
			}
			cmd := strings.Join(p.Command, " ")
			if cmd == "" {
				cmd = "[" + p.Comm + "]"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", p.PID, p.Started.Local().Format("2006-01-02 15:04:05"), in, cmd)
		}
		return tw.Flush()
	})
	return c
}
