package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/llmproxy"
)

// LLMConfig is the daemon's LLM proxy (serve --llm-*; docs/LLM-PROXY.md).
type LLMConfig struct {
	// Listen serves the proxy on a loopback HOST:PORT ("": no proxy).
	Listen string
	// Upstream is the default upstream base URL (a sandbox may have its own).
	Upstream string
	// Gate is local, remote or none (llmproxy.ParseGate); Strict answers
	// 503 instead of the reply when the checkpoint failed or timed out.
	Gate        string
	Strict      bool
	GateTimeout time.Duration
	// NonTurn are more path suffixes that never close a turn.
	NonTurn []string
}

// check applies the rules before anything is opened. The proxy has no
// authentication, so it listens on loopback only.
func (f LLMConfig) check() error {
	if f.Listen == "" {
		if f.Upstream != "" || f.Strict || f.Gate != "local" || len(f.NonTurn) > 0 {
			return fmt.Errorf("serve: the --llm-* flags are for --llm-listen: %w", errdefs.ErrInvalid)
		}
		return nil
	}
	host, _, err := net.SplitHostPort(f.Listen)
	if err != nil {
		return fmt.Errorf("serve: --llm-listen %q: %v: %w", f.Listen, err, errdefs.ErrInvalid)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("serve: refusing --llm-listen %s: the LLM proxy has no authentication, so it listens on a loopback address only (127.0.0.1:PORT or [::1]:PORT): %w", f.Listen, errdefs.ErrInvalid)
	}
	if _, err := llmproxy.ParseGate(f.Gate); err != nil {
		return fmt.Errorf("serve: --llm-gate: %w", err)
	}
	if f.GateTimeout <= 0 {
		return fmt.Errorf("serve: --llm-gate-timeout must be positive: %w", errdefs.ErrInvalid)
	}
	if f.Upstream != "" {
		if err := llmproxy.CheckUpstream(f.Upstream); err != nil {
			return fmt.Errorf("serve: --llm-upstream: %w", err)
		}
	}
	return nil
}

// startLLM serves the LLM proxy of srv's home; stop shuts it down. Without
// Listen it does nothing.
func startLLM(ctx context.Context, log *slog.Logger, srv *Server, f LLMConfig, errc chan<- error) (stop func(context.Context), err error) {
	if f.Listen == "" {
		return func(context.Context) {}, nil
	}
	gate, _ := llmproxy.ParseGate(f.Gate)
	if gate == llmproxy.GateRemote && !srv.Service().E.Remote().HasRemote() {
		return nil, fmt.Errorf("serve: --llm-gate remote needs a remote store (turnsnap init --remote URL first): %w", errdefs.ErrPrecondition)
	}
	l, err := net.Listen("tcp", f.Listen)
	if err != nil {
		return nil, fmt.Errorf("serve: --llm-listen: %w", err)
	}
	url := "http://" + l.Addr().String()
	llm, err := NewLLM(ctx, srv.Service(), LLMOptions{URL: url, Upstream: f.Upstream, Gate: gate,
		Strict: f.Strict, GateTimeout: f.GateTimeout, NonTurn: f.NonTurn, Logger: log, Registerer: srv.Monitor().Registry()})
	if err != nil {
		l.Close()
		return nil, err
	}
	llm.routes.api = srv // the sandboxes' MCP endpoints, through their routes
	hs := &http.Server{Handler: llm.Handler(), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go func() {
		if err := hs.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	up := "(per sandbox only)"
	if f.Upstream != "" {
		up = llmproxy.RedactURL(f.Upstream)
	}
	log.Info("serving the LLM proxy", "url", url+"/llm/{sandbox}/", "gate", gate, "upstream", up)
	return func(sctx context.Context) {
		if err := hs.Shutdown(sctx); err != nil {
			hs.Close()
		}
		llm.Close()
	}, nil
}
