package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/client"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/llmproxy"
	"github.com/turnsnap/turnsnap/server"
)

// llmService is what the LLM commands need of turnsnap, daemon or direct.
type llmService interface {
	SetLLMUpstream(ctx context.Context, name string, req api.LLMUpstreamRequest) (*api.LLMSandbox, error)
	LLMStatus(ctx context.Context) (*api.LLMStatus, error)
}

var (
	_ llmService = (*server.Service)(nil)
	_ llmService = (*client.Client)(nil)
)

// setLLMUpstream records a sandbox's own upstream ("" : nothing to do).
func setLLMUpstream(ctx context.Context, s service, name, upstream string) error {
	if upstream == "" {
		return nil
	}
	ls, ok := s.(llmService)
	if !ok {
		return fmt.Errorf("sandbox %s: this turnsnap cannot set an llm upstream: %w", name, errdefs.ErrUnavailable)
	}
	_, err := ls.SetLLMUpstream(ctx, name, api.LLMUpstreamRequest{LLMUpstream: &upstream})
	return err
}

// registerLLMFlags defines serve's LLM proxy flags (--llm-*) into f.
func registerLLMFlags(fl *pflag.FlagSet, f *server.LLMConfig) {
	fl.StringVar(&f.Listen, "llm-listen", "", "serve the LLM proxy on ADDR (loopback only: 127.0.0.1:PORT or [::1]:PORT) at http://ADDR/llm/{sandbox}/")
	fl.StringVar(&f.Upstream, "llm-upstream", "", "the LLM proxy's default upstream base URL (a sandbox's own: sandbox create --llm-upstream)")
	fl.StringVar(&f.Gate, "llm-gate", "local", "hold each model reply until its turn's checkpoint is committed: local, remote (in the bucket) or none")
	fl.BoolVar(&f.Strict, "llm-gate-strict", false, "answer 503 (problem+json) instead of the reply when the checkpoint failed or the gate timed out")
	fl.DurationVar(&f.GateTimeout, "llm-gate-timeout", llmproxy.DefaultGateTimeout, "longest a reply waits at the gate")
	fl.StringSliceVar(&f.NonTurn, "llm-non-turn", nil, "more path suffixes that never close a turn (repeatable)")
}

func (a *app) runCmd() *cobra.Command {
	noFinal := false
	c := &cobra.Command{
		Use:   "run NAME -- AGENT-CMD [ARGS...]",
		Short: "Run an unmodified agent on the host with its model calls going through the sandbox's LLM route",
		Long: `run starts AGENT-CMD on the host (not in the sandbox) with OPENAI_BASE_URL,
OPENAI_API_BASE and ANTHROPIC_BASE_URL pointing at the sandbox's route on the
daemon's LLM proxy (turnsnap serve --llm-listen), TURNSNAP_SANDBOX set to NAME
and TURNSNAP_ROOT to the sandbox's root. Each of the agent's model calls then
closes a turn: a checkpoint taken during the model's latency. When the agent
exits, run closes its last turn with a final checkpoint (what the agent's
tools did after its last model call is kept; --no-final-checkpoint leaves it
out). run exits with the agent's status (128+N if a signal N killed it), or,
if the agent succeeded and the final checkpoint failed, with the
checkpoint's error. With no daemon, or a daemon without the proxy, it exits 6.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				return fmt.Errorf("run: want NAME -- AGENT-CMD...: %w", errdefs.ErrInvalid)
			}
			return a.run(cmd.Context(), args[0], args[1:], !noFinal)
		},
	}
	c.Flags().BoolVar(&noFinal, "no-final-checkpoint", false, "do not checkpoint the sandbox when the agent exits")
	return c
}

func (a *app) run(ctx context.Context, name string, argv []string, final bool) error {
	c, err := a.daemon(ctx)
	if err != nil {
		return err
	}
	if c == nil {
		return fmt.Errorf("run %s: no daemon serves %s; start one with its LLM proxy: turnsnap serve --llm-listen 127.0.0.1:PORT --llm-upstream URL: %w",
			name, a.home, errdefs.ErrUnavailable)
	}
	st, err := c.LLMStatus(ctx)
	if err != nil {
		return err
	}
	if !st.Proxy {
		return fmt.Errorf("run %s: the daemon serving %s has no LLM proxy; restart it with --llm-listen 127.0.0.1:PORT: %w",
			name, a.home, errdefs.ErrUnavailable)
	}
	found := false
	for _, s := range st.Sandboxes {
		found = found || s.Name == name
	}
	if !found {
		return fmt.Errorf("run: sandbox %s: %w", name, errdefs.ErrNotFound)
	}
	p, err := c.SandboxPath(ctx, name)
	if err != nil {
		return err
	}
	env, err := llmproxy.AgentEnv(os.Environ(), st.URL, name)
	if err != nil {
		return err
	}
	env = append(env, "TURNSNAP_ROOT="+p.Root)
	// Not CommandContext: a ^C reaches the agent from the terminal itself,
	// and the agent decides how to stop; run only reports its status.
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Stdin, cmd.Stdout, cmd.Stderr = env, os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s: %v: %w", name, err, errdefs.ErrInvalid)
	}
	err = cmd.Wait()
	status := "status 0"
	var exit error
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			exit, status = commandExit{128 + int(ws.Signal())}, "signal "+ws.Signal().String()
		} else {
			exit, status = commandExit{ee.ExitCode()}, fmt.Sprintf("status %d", ee.ExitCode())
		}
	case err != nil:
		return fmt.Errorf("run %s: %w", name, err)
	}
	if final {
		// The agent's last model call closed the turn before it; what its
		// tools did after that call is a turn of its own, which no model
		// call will ever close.
		cp, cerr := c.Checkpoint(context.WithoutCancel(ctx), name, api.CheckpointRequest{Message: "turnsnap run: agent exited (" + status + ")"})
		switch {
		case cerr != nil:
			fmt.Fprintf(os.Stderr, "turnsnap run: final checkpoint of %s failed: %v\n", name, cerr)
			if exit == nil {
				return fmt.Errorf("run %s: final checkpoint: %w", name, cerr)
			}
		case cp.Class == api.ClassSkip:
			fmt.Fprintf(os.Stderr, "turnsnap run: agent exited (%s); nothing changed since the last checkpoint\n", status)
		default:
			fmt.Fprintf(os.Stderr, "turnsnap run: agent exited (%s); final checkpoint %s (%s, %d bytes new)\n", status, cp.ID.Short(), cp.Class, cp.BytesNew)
		}
	}
	return exit
}

func (a *app) llmCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "llm",
		Short: "Show the daemon's LLM proxy and each sandbox's route and upstream",
		Long: `llm prints whether the daemon serves the LLM proxy (serve --llm-listen), its
gate and default upstream, and for each sandbox its route and its own
upstream if it has one (sandbox create --llm-upstream). URLs are shown
redacted. Without a daemon it lists the upstreams only.`,
		Args: cobra.NoArgs,
		RunE: a.withService(func([]string) bool { return true }, func(ctx context.Context, s service, _ []string) error {
			ls, ok := s.(llmService)
			if !ok {
				return fmt.Errorf("llm: this turnsnap cannot list llm upstreams: %w", errdefs.ErrUnavailable)
			}
			st, err := ls.LLMStatus(ctx)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), st)
			}
			w := a.stdout()
			if st.Proxy {
				def := st.Default
				if def == "" {
					def = "(none: sandboxes need their own)"
				}
				fmt.Fprintf(w, "proxy %s/llm/{sandbox}/  gate %s  default upstream %s\n", st.URL, st.Gate, def)
			} else {
				fmt.Fprintln(w, "no LLM proxy (turnsnap serve --llm-listen 127.0.0.1:PORT)")
			}
			for _, sb := range st.Sandboxes {
				up := sb.Upstream
				if up == "" {
					up = "(default)"
				}
				fmt.Fprintf(w, "%-20s %s  %s\n", sb.Name, up, sb.Route)
			}
			return nil
		}),
	}
}
