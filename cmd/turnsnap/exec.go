package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/engine/api"
)

// commandExit carries a sandboxed command's exit status out of cobra, so
// `turnsnap exec` exits with it and prints nothing of its own.
type commandExit struct{ code int }

func (c commandExit) Error() string { return fmt.Sprintf("command exited with status %d", c.code) }

func (a *app) execCmd() *cobra.Command {
	var detach bool
	var logFile string
	c := &cobra.Command{
		Use:   "exec NAME [--detach] -- CMD [ARGS...]",
		Short: "Run a command inside the sandbox (its container starts on first use)",
		Long: `exec runs CMD in the sandbox's container (runc, the sandbox root as its root,
its own pid, mount, ipc, uts and network namespaces) with stdin, stdout and
stderr streamed through pipes, and exits with CMD's exit status. --detach
starts a long-lived process (a dev server, a database) and returns at once
with its pid; its output goes to --log FILE inside the sandbox (default
nowhere). Processes alive at a turn's end are
checkpointed with CRIU by the next 'turnsnap checkpoint'. The turnsnap home
is free while CMD runs; a checkpoint taken meanwhile is refused until it ends.`,
		Args: cobra.MinimumNArgs(2),
	}
	c.RunE = a.withService(nil, func(ctx context.Context, s service, args []string) error {
		req := api.ExecRequest{Argv: args[1:], Detach: detach, Log: logFile}
		stdio := api.Stdio{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}
		if detach {
			stdio = api.Stdio{}
		}
		r, err := s.Exec(ctx, args[0], req, stdio)
		if err != nil {
			return err
		}
		if detach {
			if a.json {
				return printJSON(a.stdout(), r)
			}
			fmt.Fprintf(a.stdout(), "started pid %d in sandbox %s\n", r.PID, args[0])
			return nil
		}
		if r.ExitCode != 0 {
			return commandExit{r.ExitCode}
		}
		return nil
	})
	c.Flags().BoolVarP(&detach, "detach", "d", false, "start a long-lived process and return at once (prints its pid)")
	c.Flags().StringVar(&logFile, "log", "", "with --detach: a file inside the sandbox the process's output is appended to")
	return c
}
