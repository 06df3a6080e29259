package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/engine"
)

// commandExit carries a sandboxed command's exit status out of cobra, so
// `turnsnap exec` exits with it and prints nothing of its own.
type commandExit struct{ code int }

func (c commandExit) Error() string { return fmt.Sprintf("command exited with status %d", c.code) }

func (a *app) execCmd() *cobra.Command {
	var detach bool
	c := &cobra.Command{
		Use:   "exec NAME [--detach] -- CMD [ARGS...]",
		Short: "Run a command inside the sandbox (its container starts on first use)",
		Long: `exec runs CMD in the sandbox's container (runc, the sandbox root as its root,
its own pid, mount, ipc, uts and network namespaces) with stdin, stdout and
stderr streamed through pipes, and exits with CMD's exit status. --detach
starts a long-lived process (a dev server, a database) and returns at once;
its output stays inside the sandbox. Processes alive at a turn's end are
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
		code, err := run(ctx, args[1:], engine.ExecOptions{
			Detach: detach, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		})
		if err != nil {
			return err
		}
		if detach && a.json {
			return printJSON(a.stdout(), map[string]any{"sandbox": args[0], "started": args[1:]})
		}
		if code != 0 {
			return commandExit{code}
		}
		return nil
	})
	c.Flags().BoolVarP(&detach, "detach", "d", false, "start a long-lived process and return at once")
	return c
}
