package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/proc"
)

// commandExit carries a sandboxed command's exit status out of cobra, so
// `turnsnap exec` exits with it and prints nothing of its own.
type commandExit struct{ code int }

func (c commandExit) Error() string { return fmt.Sprintf("command exited with status %d", c.code) }

func (a *app) execCmd() *cobra.Command {
	var detach bool
	var logPath string
	var agent bool
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
is free while CMD runs; a checkpoint taken meanwhile is refused until it ends,
unless CMD is the agent itself (TURNSNAP_AGENT=1 in its environment, e.g.
exec NAME -- env TURNSNAP_AGENT=1 AGENT...): the agent's own processes are not
sandbox state and a checkpoint leaves them out (docs/PROCESSES.md).

--agent starts CMD as the agent: TURNSNAP_AGENT=1, and HOME, TMPDIR, the XDG
directories and CLAUDE_CONFIG_DIR in ` + proc.AgentStateDir + `, a tmpfs of the
container that is not sandbox state (the agent's own files neither make a
turn a change nor survive a rollback). The sandbox needs env(1).
ANTHROPIC_BASE_URL and OPENAI_BASE_URL point at the daemon's LLM proxy for
this sandbox, on the container's own loopback (` + proc.AgentLLMAddr + `, opened by
serve --llm-listen; docs/LLM-PROXY.md), unless CMD sets them (env VAR=... CMD).`,
		Args: cobra.MinimumNArgs(2),
	}
	c.RunE = a.withService(nil, func(ctx context.Context, s service, args []string) error {
		argv := args[1:]
		if agent {
			if detach {
				return fmt.Errorf("exec %s: --agent runs in the foreground (a detached process is the sandbox's), not with --detach: %w", args[0], errdefs.ErrInvalid)
			}
			argv = proc.AgentArgv(append(proc.AgentLLMEnv(args[0]), argv...))
		}
		req := api.ExecRequest{Argv: argv, Detach: detach, Log: logPath}
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
			fmt.Fprintln(a.stdout(), r.PID) // the pid alone, for scripts
			return nil
		}
		if r.ExitCode != 0 {
			return commandExit{r.ExitCode}
		}
		return nil
	})
	c.Flags().BoolVarP(&detach, "detach", "d", false, "start a long-lived process, print its pid and return at once")
	c.Flags().BoolVar(&agent, "agent", false, "run CMD as the agent inside its sandbox: not sandbox state, its own files in "+proc.AgentStateDir)
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
	c.RunE = a.withService(readOnly, func(ctx context.Context, s service, args []string) error {
		l, err := s.Processes(ctx, args[0])
		if err != nil {
			return err
		}
		if a.json {
			return printJSON(a.stdout(), l)
		}
		if l.Interrupted != nil {
			fmt.Fprintf(a.stdout(), "sandbox %s: %s\n", l.Sandbox, l.Interrupted.Describe(l.Sandbox))
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
