package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/llmproxy"
)

// LLMOptions configures the daemon's LLM proxy (docs/LLM-PROXY.md).
type LLMOptions struct {
	// URL is where the proxy listens (http://HOST:PORT), for GET /v1/llm
	// and `turnsnap run`.
	URL string
	// Upstream is the default upstream ("" : every sandbox needs its own).
	Upstream    string
	Gate        llmproxy.Gate
	Strict      bool
	GateTimeout time.Duration
	NonTurn     []string
	Logger      *slog.Logger
	// Registerer receives the proxy's metrics (the daemon's /metrics).
	Registerer prometheus.Registerer
}

// LLM is the daemon's side of the LLM proxy: it implements llmproxy.Turns
// over the service (each model call's checkpoint goes through the same
// path as POST /v1/sandboxes/{name}/checkpoints: events, metrics,
// background upload) and keeps each sandbox's journal as a tree that the
// checkpoint references, reset to the restored checkpoint's on a restore.
type LLM struct {
	svc     *Service
	opts    LLMOptions
	proxy   *llmproxy.Proxy
	journal *llmproxy.TreeJournal
	ups     *llmproxy.Upstreams
	log     *slog.Logger
	routes  agentRoutes // in the sandboxes' containers (llm_route.go)
}

// NewLLM makes the proxy of svc's home and resets every sandbox's journal
// to its head's (the index lives in memory). Close it when done.
func NewLLM(ctx context.Context, svc *Service, opts LLMOptions) (*LLM, error) {
	if opts.Upstream != "" {
		if err := llmproxy.CheckUpstream(opts.Upstream); err != nil {
			return nil, err
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	l := &LLM{svc: svc, opts: opts, journal: llmproxy.NewTreeJournal(svc.E.Keys().IDs(), svc.E.Blobs()),
		ups: llmproxy.NewUpstreams(svc.E.Home()), log: opts.Logger}
	p, err := llmproxy.New(llmproxy.Options{Upstream: opts.Upstream, UpstreamFor: l.upstreamFor, Turns: l,
		Journal: l.journal, ReplayFor: l.replayFor, Gate: opts.Gate, GateTimeout: opts.GateTimeout, Strict: opts.Strict,
		NonTurn: opts.NonTurn, Registerer: opts.Registerer, Logger: opts.Logger})
	if err != nil {
		return nil, err
	}
	l.proxy = p
	if err := l.restoredAll(ctx); err != nil {
		p.Close()
		return nil, err
	}
	svc.LLM = l
	return l, nil
}

// Handler serves /llm/{sandbox}/<path>.
func (l *LLM) Handler() http.Handler { return l.proxy }

// Close stops the proxy's checkpoints.
func (l *LLM) Close() { l.routes.closeRoutes(); l.proxy.Close() }

func (l *LLM) upstreamFor(ctx context.Context, sandbox string) (string, error) {
	// A route to no sandbox is answered here: forwarded, its model call
	// would be paid for and its turn's checkpoint fail.
	name, err := delta.ParseSandboxName(sandbox)
	if err != nil {
		return "", err
	}
	if ok, err := l.svc.E.SandboxExists(ctx, name); err != nil {
		return "", err
	} else if !ok {
		return "", fmt.Errorf("sandbox %s does not exist: %w", sandbox, errdefs.ErrNotFound)
	}
	u, err := l.ups.Get(sandbox)
	if err != nil {
		return "", err
	}
	if u == "" && l.opts.Upstream == "" {
		return "", fmt.Errorf("sandbox %s has no llm upstream and the daemon has no default (--llm-upstream): %w", sandbox, errdefs.ErrNotFound)
	}
	return u, nil
}

// replayFor is a sandbox's replay setting (PATCH llm_replay).
func (l *LLM) replayFor(_ context.Context, sandbox string) (llmproxy.Replay, error) {
	return l.ups.Replay(sandbox)
}

// Checkpoint implements llmproxy.Turns.
func (l *LLM) Checkpoint(ctx context.Context, t llmproxy.Turn) (llmproxy.Committed, error) {
	// The checkpoint that closes turn k holds its parent's journal and the
	// exchanges recorded since of turns below k: the replies whose tool
	// calls the state it captures already holds.
	snap := l.journal.Snapshot(t.Sandbox, t.Number)
	// The reply ready before the checkpoint committed moves it to the
	// engine's urgent lane (engine/admission).
	opts := engine.CheckpointOptions{Journal: snap.Save, Urgent: t.Urgent}
	if !t.Conv.IsZero() {
		conv := t.Conv
		opts.Conv = &conv
	}
	if t.Number >= 0 {
		n := t.Number
		opts.Turn = &n
	}
	name, err := delta.ParseSandboxName(t.Sandbox)
	if err != nil {
		return llmproxy.Committed{}, err
	}
	s := l.svc
	s.Monitor.started(t.Sandbox)
	start := time.Now()
	r, err := s.E.Checkpoint(ctx, name, opts)
	s.Monitor.checkpointed(t.Sandbox, r, err, time.Since(start))
	if err != nil {
		return llmproxy.Committed{}, err
	}
	if r.Class != delta.ClassSkip {
		l.journal.Committed(ctx, snap)
		if s.Uploads != nil {
			s.Uploads.Committed(t.Sandbox, r.ID)
		}
	}
	return llmproxy.Committed{ID: r.ID, Class: string(r.Class)}, nil
}

// WaitRemote implements llmproxy.Turns: the background pusher uploads the
// checkpoint in its normal lane until the reply is ready (t.Urgent); then
// the wait joins the pusher's next round, which is urgent while anyone
// waits.
func (l *LLM) WaitRemote(ctx context.Context, t llmproxy.Turn, c llmproxy.Committed) error {
	if !l.svc.E.Remote().HasRemote() {
		return fmt.Errorf("sandbox %s: the remote gate needs a remote store (turnsnap init --remote): %w", t.Sandbox, errdefs.ErrPrecondition)
	}
	select {
	case <-t.Urgent:
	case <-ctx.Done():
		return ctx.Err()
	}
	pending, err := l.svc.E.Remote().PendingCheckpoints(ctx)
	if err != nil {
		return err
	}
	if !pending[c.ID] {
		return nil
	}
	if _, err := l.svc.push(ctx, t.Sandbox, true); err != nil {
		return fmt.Errorf("checkpoint %s is durable locally, not yet remotely: %w", c.ID.Short(), err)
	}
	return nil
}

// restored resets sandbox's journal to its head's: after a rollback, a
// branch or a restore from the bucket, a replaying agent is answered only
// with the exchanges the restored state holds.
func (l *LLM) restored(ctx context.Context, name delta.SandboxName) {
	sandbox := string(name)
	var root *delta.ID
	log, err := l.svc.E.History().Log(ctx, name)
	if err == nil {
		for _, e := range log {
			if e.Head {
				root = e.Checkpoint.Journal
			}
		}
	}
	if err == nil {
		err = l.journal.Reset(ctx, sandbox, root)
	}
	if err != nil {
		// Without the index the sandbox's calls go to the model, live: an
		// empty journal is always safe, a stale one never is.
		l.journal.Reset(ctx, sandbox, nil)
		if !errors.Is(err, errdefs.ErrNotFound) {
			l.log.Warn("llm journal not restored; replays will ask the model", "sandbox", sandbox, "err", err)
		}
	}
}

// restoredAll resets every sandbox's journal to its head's: at start and
// after a catalog rebuild (an off-host restore).
func (l *LLM) restoredAll(ctx context.Context) error {
	sbs, err := l.svc.E.ListSandboxes(ctx)
	if err != nil {
		return err
	}
	for _, sb := range sbs {
		l.restored(ctx, sb.Sandbox.Name)
	}
	return nil
}

// llmRemoved forgets a removed sandbox's upstream and journal, so a new
// sandbox of the same name starts with neither.
func (s *Service) llmRemoved(ctx context.Context, name string) {
	ups := llmproxy.NewUpstreams(s.E.Home())
	if u, err := ups.Get(name); err == nil && u != "" {
		ups.Set(name, "")
	}
	if r, err := ups.Replay(name); err == nil && r != llmproxy.ReplayAuto {
		ups.SetReplay(name, llmproxy.ReplayAuto)
	}
	if s.LLM != nil {
		s.LLM.journal.Reset(ctx, name, nil)
	}
}

// llmRestored is the hook the restoring service methods call.
func (s *Service) llmRestored(ctx context.Context, sandbox delta.SandboxName) {
	if s.LLM != nil {
		s.LLM.restored(ctx, sandbox)
		s.LLM.routeAgent(ctx, sandbox) // a restored container has a new network namespace
	}
}

// SetLLMUpstream sets (or with "" clears) a sandbox's own upstream.
func (s *Service) SetLLMUpstream(ctx context.Context, name string, req api.LLMUpstreamRequest) (*api.LLMSandbox, error) {
	// The sandbox first: a name that is not this home's is not found,
	// whatever the request says (another tenant learns nothing from it).
	if _, err := s.GetSandbox(ctx, name); err != nil {
		return nil, err
	}
	if req.LLMUpstream == nil && req.LLMReplay == nil {
		return nil, invalidf("sandbox %s: nothing to change (llm_upstream, llm_replay)", name)
	}
	var replay llmproxy.Replay
	if req.LLMReplay != nil {
		var err error
		if replay, err = llmproxy.ParseReplay(*req.LLMReplay); err != nil {
			return nil, invalidf("sandbox %s: %v", name, err)
		}
	}
	ups := llmproxy.NewUpstreams(s.E.Home())
	if req.LLMUpstream != nil {
		if err := ups.Set(name, *req.LLMUpstream); err != nil {
			return nil, err
		}
	}
	if req.LLMReplay != nil {
		if err := ups.SetReplay(name, replay); err != nil {
			return nil, err
		}
	}
	up, err := ups.Get(name)
	if err != nil {
		return nil, err
	}
	if replay, err = ups.Replay(name); err != nil {
		return nil, err
	}
	out := &api.LLMSandbox{Name: name, Upstream: redactOrEmpty(up)}
	if replay == llmproxy.ReplayOff {
		out.Replay = string(replay)
	}
	if s.LLM != nil {
		out.Route, _ = llmproxy.RouteURL(s.LLM.opts.URL, name)
		s.LLM.log.Info("llm route set", "sandbox", name, "upstream", out.Upstream, "replay", out.Replay)
	}
	return out, nil
}

// LLMStatus lists the sandboxes' upstreams and, with the proxy, their routes.
func (s *Service) LLMStatus(ctx context.Context) (*api.LLMStatus, error) {
	m, off, err := llmproxy.NewUpstreams(s.E.Home()).Settings()
	if err != nil {
		return nil, err
	}
	out := &api.LLMStatus{Sandboxes: []api.LLMSandbox{}}
	if s.LLM != nil {
		o := s.LLM.opts
		out.Proxy, out.URL, out.Gate, out.Default = true, o.URL, string(o.Gate), redactOrEmpty(o.Upstream)
		if out.Gate == "" {
			out.Gate = string(llmproxy.GateLocal)
		}
		out.GateTimeout = o.GateTimeout.Seconds()
	}
	sbs, err := s.E.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	for _, sb := range sbs {
		row := api.LLMSandbox{Name: string(sb.Sandbox.Name), Upstream: redactOrEmpty(m[string(sb.Sandbox.Name)]), Replay: off[string(sb.Sandbox.Name)]}
		if out.Proxy {
			row.Route, _ = llmproxy.RouteURL(strings.TrimSuffix(out.URL, "/"), row.Name)
		}
		out.Sandboxes = append(out.Sandboxes, row)
	}
	return out, nil
}

func redactOrEmpty(u string) string {
	if u == "" {
		return ""
	}
	return llmproxy.RedactURL(u)
}

// llmRoutes registers the LLM routes of the API.
func (s *Server) llmRoutes() {
	sv := s.svc
	route(s, "PATCH /v1/sandboxes/{name}", func(ctx context.Context, r *http.Request, req api.LLMUpstreamRequest) (*api.LLMSandbox, error) {
		return sv.SetLLMUpstream(ctx, r.PathValue("name"), req)
	})
	route(s, "GET /v1/llm", func(ctx context.Context, _ *http.Request, _ none) (*api.LLMStatus, error) {
		return sv.LLMStatus(ctx)
	})
}
