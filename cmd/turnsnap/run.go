package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/api"
	"github.com/turnsnap/turnsnap/engine/api/client"
	"github.com/turnsnap/turnsnap/llmproxy"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// llmService is what the LLM commands need of turnsnap, daemon or direct.
type llmService interface {
	SetLLMUpstream(ctx context.Context, name string, req api.LLMUpstreamRequest) (*api.LLMSandbox, error)
	LLMStatus(ctx context.Context) (*api.LLMStatus, error)
}

var (
	_ llmService = (*api.Service)(nil)
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

// llmFlags are serve's LLM proxy flags.
type llmFlags struct {
	listen      string
	upstream    string
	gate        string
	strict      bool
	gateTimeout time.Duration
	nonTurn     []string
}

func (f *llmFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&f.listen, "llm-listen", "", "serve the LLM proxy on ADDR (loopback only: 127.0.0.1:PORT or [::1]:PORT) at http://ADDR/llm/{sandbox}/")
	fl.StringVar(&f.upstream, "llm-upstream", "", "the LLM proxy's default upstream base URL (a sandbox's own: sandbox create --llm-upstream)")
	fl.StringVar(&f.gate, "llm-gate", "local", "hold each model reply until its turn's checkpoint is committed: local, remote (in the bucket) or none")
	fl.BoolVar(&f.strict, "llm-gate-strict", false, "answer 503 (problem+json) instead of the reply when the checkpoint failed or the gate timed out")
	fl.DurationVar(&f.gateTimeout, "llm-gate-timeout", llmproxy.DefaultGateTimeout, "longest a reply waits at the gate")
	fl.StringSliceVar(&f.nonTurn, "llm-non-turn", nil, "more path suffixes that never close a turn (repeatable)")
}

// check applies the rules before anything is opened. The proxy has no
// authentication, so it listens on loopback only.
func (f *llmFlags) check() error {
	if f.listen == "" {
		if f.upstream != "" || f.strict || f.gate != "local" || len(f.nonTurn) > 0 {
			return fmt.Errorf("serve: the --llm-* flags are for --llm-listen: %w", errdefs.ErrInvalid)
		}
		return nil
	}
	host, _, err := net.SplitHostPort(f.listen)
	if err != nil {
		return fmt.Errorf("serve: --llm-listen %q: %v: %w", f.listen, err, errdefs.ErrInvalid)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("serve: refusing --llm-listen %s: the LLM proxy has no authentication, so it listens on a loopback address only (127.0.0.1:PORT or [::1]:PORT): %w", f.listen, errdefs.ErrInvalid)
	}
	if _, err := llmproxy.ParseGate(f.gate); err != nil {
		return fmt.Errorf("serve: --llm-gate: %w", err)
	}
	if f.gateTimeout <= 0 {
		return fmt.Errorf("serve: --llm-gate-timeout must be positive: %w", errdefs.ErrInvalid)
	}
	if f.upstream != "" {
		if err := api.CheckUpstream(f.upstream); err != nil {
			return fmt.Errorf("serve: --llm-upstream: %w", err)
		}
	}
	return nil
}

// startLLM serves the LLM proxy of srv's home; stop shuts it down. Without
// --llm-listen it does nothing.
func startLLM(ctx context.Context, log *slog.Logger, srv *api.Server, f llmFlags, errc chan<- error) (stop func(context.Context), err error) {
	if f.listen == "" {
		return func(context.Context) {}, nil
	}
	gate, _ := llmproxy.ParseGate(f.gate)
	if gate == llmproxy.GateRemote && !srv.Service().E.HasRemote() {
		return nil, fmt.Errorf("serve: --llm-gate remote needs a remote store (turnsnap init --remote URL first): %w", errdefs.ErrPrecondition)
	}
	l, err := net.Listen("tcp", f.listen)
	if err != nil {
		return nil, fmt.Errorf("serve: --llm-listen: %w", err)
	}
	url := "http://" + l.Addr().String()
	llm, err := api.NewLLM(ctx, srv.Service(), api.LLMOptions{URL: url, Upstream: f.upstream, Gate: gate,
		Strict: f.strict, GateTimeout: f.gateTimeout, NonTurn: f.nonTurn, Logger: log, Registerer: srv.Monitor().Registry()})
	if err != nil {
		l.Close()
		return nil, err
	}
	hs := &http.Server{Handler: llm.Handler(), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go func() {
		if err := hs.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	up := "(per sandbox only)"
	if f.upstream != "" {
		up = api.RedactURL(f.upstream)
	}
	log.Info("serving the LLM proxy", "url", url+"/llm/{sandbox}/", "gate", gate, "upstream", up)
	return func(sctx context.Context) {
		if err := hs.Shutdown(sctx); err != nil {
			hs.Close()
		}
		llm.Close()
	}, nil
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
		case cp.Class == delta.ClassSkip:
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
