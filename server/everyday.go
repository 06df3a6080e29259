package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/engine/diffview"
	"github.com/turnsnap/turnsnap/engine/history"
	"github.com/turnsnap/turnsnap/engine/paths"
	"github.com/turnsnap/turnsnap/engine/retention"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// The everyday commands' routes (issue 16): diff with sizes, metadata and
// patches, cat, ls, restore of chosen paths, the home's lineage, ps,
// forget and the stored retention policies. Their responses are the
// engine's report types, which are what the CLI printed with --json
// before the daemon existed, so the JSON stays the same either way.

// recordGrace is a request's record grace: absent is the default.
func recordGrace(ms *int64, what string) (time.Duration, error) {
	if ms == nil {
		return retention.DefaultRecordGrace, nil
	}
	if *ms < 0 {
		return 0, invalidf("%s: negative grace", what)
	}
	return time.Duration(*ms) * time.Millisecond, nil
}

// DiffPaths is a diff described path by path (sizes, metadata, with Patch
// unified patches): what `turnsnap diff` prints.
func (s *Service) DiffPaths(ctx context.Context, name string, req api.DiffRequest) (*api.DiffResult, error) {
	if req.From == "" && req.To != "" {
		return nil, invalidf("diff of sandbox %s: a 'to' needs a 'from'", name)
	}
	sb, err := delta.ParseSandboxName(name)
	if err != nil {
		return nil, err
	}
	from, to, err := diffRefs(req.From, req.To)
	if err != nil {
		return nil, err
	}
	r, err := s.E.History().DiffWith(ctx, sb, from, to, diffview.Options{Patch: req.Patch})
	if err != nil {
		return nil, err
	}
	if r.Paths == nil {
		r.Paths = []diffview.PathChange{}
	}
	return wirePtr[api.DiffResult](r, nil)
}

// Cat writes the file at path as it was in checkpoint ref to w; see
// paths.Ops.Cat (an error after w got bytes means the output is incomplete).
func (s *Service) Cat(ctx context.Context, ref, path string, w io.Writer) error {
	r, err := catalog.ParseCheckpointRef(ref)
	if err != nil {
		return err
	}
	return s.E.Paths().Cat(ctx, r, path, w)
}

func (s *Service) Ls(ctx context.Context, ref, path string) ([]api.LsEntry, error) {
	r, err := catalog.ParseCheckpointRef(ref)
	if err != nil {
		return nil, err
	}
	entries, err := s.E.Paths().Ls(ctx, r, path)
	if err != nil {
		return nil, err
	}
	if entries == nil {
		entries = []paths.LsEntry{}
	}
	return wire[[]api.LsEntry](entries)
}

func (s *Service) RestorePaths(ctx context.Context, name string, req api.RestorePathsRequest) (*api.RestorePathsResult, error) {
	if req.Checkpoint == "" {
		return nil, invalidf("restore into sandbox %s: no checkpoint given", name)
	}
	if len(req.Paths) == 0 || len(req.Paths) > api.MaxRestorePaths {
		return nil, invalidf("restore into sandbox %s: give between 1 and %d paths, not %d", name, api.MaxRestorePaths, len(req.Paths))
	}
	sb, err := delta.ParseSandboxName(name)
	if err != nil {
		return nil, err
	}
	ref, err := catalog.ParseCheckpointRef(req.Checkpoint)
	if err != nil {
		return nil, err
	}
	r, err := s.E.Paths().RestorePaths(ctx, sb, ref, req.Paths, paths.RestorePathsOptions{To: req.To})
	if err == nil && req.To == "" {
		s.Monitor.changed(api.Event{Type: api.EventRestore, Sandbox: name, Checkpoint: r.Checkpoint.String(), Paths: len(r.Paths), DurationMS: r.DurationMS})
	}
	return wirePtr[api.RestorePathsResult](r, err)
}

// Lineage is every checkpoint of the home, children before parents.
func (s *Service) Lineage(ctx context.Context) (*api.Lineage, error) {
	return wirePtr[api.Lineage](s.E.History().Lineage(ctx, history.LineageOptions{}))
}

func (s *Service) Processes(ctx context.Context, name string) (*api.ProcessList, error) {
	sb, err := delta.ParseSandboxName(name)
	if err != nil {
		return nil, err
	}
	return wirePtr[api.ProcessList](s.E.Processes().List(ctx, sb, engine.ProcessesOptions{}))
}

func (s *Service) Forget(ctx context.Context, req api.ForgetRequest) (*api.Forgotten, error) {
	grace, err := recordGrace(req.GraceMS, "forget")
	if err != nil {
		return nil, err
	}
	opts, err := wire[retention.ForgetOptions](req.ForgetOptions)
	if err != nil {
		return nil, invalidf("forget request: %v", err)
	}
	opts.Grace = grace
	r, err := s.E.Retention().Forget(ctx, opts)
	if err != nil {
		return nil, err
	}
	return s.forgotten(ctx, r, req.GC)
}

// ApplyPolicies carries out the stored policies (what the daemon's
// --forget-interval does on its schedule).
func (s *Service) ApplyPolicies(ctx context.Context, req api.ApplyPoliciesRequest) (*api.Forgotten, error) {
	grace, err := recordGrace(req.GraceMS, "policy apply")
	if err != nil {
		return nil, err
	}
	r, err := s.E.Retention().ApplyPolicies(ctx, grace)
	if err != nil {
		return nil, err
	}
	return s.forgotten(ctx, r, req.GC)
}

func (s *Service) forgotten(ctx context.Context, r *retention.ForgetReport, gc bool) (*api.Forgotten, error) {
	if r.Sandboxes == nil {
		r.Sandboxes = []retention.ForgetSandbox{}
	}
	if !r.DryRun {
		s.Monitor.forgot(r)
		s.Monitor.changed(api.Event{Type: api.EventForget, Deleted: r.CheckpointsDeleted})
	}
	rep, err := wire[api.ForgetReport](r)
	if err != nil {
		return nil, err
	}
	out := &api.Forgotten{ForgetReport: rep}
	if gc && !r.DryRun {
		g, err := s.E.Retention().GC(ctx, retention.GCOptions{Grace: retention.DefaultGCGrace})
		if err != nil {
			return nil, fmt.Errorf("forgot %d checkpoints, then gc: %w", r.CheckpointsDeleted, err)
		}
		s.Monitor.gced(g)
		if out.GC, err = wirePtr[api.GCReport](g, nil); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ShowPolicies is the home's policy and the one each sandbox (or only
// sandbox, if set) follows.
func (s *Service) ShowPolicies(ctx context.Context, sandbox string) (*api.PolicyView, error) {
	v, err := s.E.Retention().ShowPolicies(ctx, sandbox)
	if err != nil {
		return nil, err
	}
	if v.Sandboxes == nil {
		v.Sandboxes = []retention.SandboxPolicy{}
	}
	return wirePtr[api.PolicyView](v, nil)
}

// SetPolicy stores a policy and returns the policies as they now are.
func (s *Service) SetPolicy(ctx context.Context, req api.PolicyOptions) (*api.PolicyView, error) {
	opts, err := wire[retention.PolicyOptions](req)
	if err != nil {
		return nil, invalidf("policy: %v", err)
	}
	if err := s.E.Retention().SetPolicy(ctx, opts); err != nil {
		return nil, err
	}
	return s.ShowPolicies(ctx, req.Sandbox)
}

// ClearPolicy removes a sandbox's policy (or the home's, for "") and
// returns the policies as they now are.
func (s *Service) ClearPolicy(ctx context.Context, sandbox string) (*api.PolicyView, error) {
	if err := s.E.Retention().ClearPolicy(ctx, retention.PolicyOptions{Sandbox: sandbox}); err != nil {
		return nil, err
	}
	return s.ShowPolicies(ctx, sandbox)
}

// ErrRestoreToRefused is why the daemon does not restore into a host
// directory: it usually runs as root, so a client able to reach its socket
// could have it write wherever the client names.
var ErrRestoreToRefused = fmt.Errorf("restore --to writes into a host directory, which the daemon (turnsnap serve) does not do for a client: it runs with its own rights and would write wherever the client names; restore into the sandbox and copy the files out of its root, or stop the daemon and run restore --to directly: %w", errdefs.ErrInvalid)

func (s *Server) everydayRoutes() {
	sv := s.svc
	route(s, "GET /v1/sandboxes/{name}/diff", func(ctx context.Context, r *http.Request, _ none) (*api.DiffResult, error) {
		q := r.URL.Query()
		return sv.DiffPaths(ctx, r.PathValue("name"), api.DiffRequest{From: q.Get("from"), To: q.Get("to"), Patch: q.Get("patch") == "true"})
	})
	s.handle("GET /v1/checkpoints/{ref}/content", s.cat)
	route(s, "GET /v1/checkpoints/{ref}/entries", func(ctx context.Context, r *http.Request, _ none) ([]api.LsEntry, error) {
		return sv.Ls(ctx, r.PathValue("ref"), r.URL.Query().Get("path"))
	})
	route(s, "POST /v1/sandboxes/{name}/restore", func(ctx context.Context, r *http.Request, req api.RestorePathsRequest) (*api.RestorePathsResult, error) {
		if req.To != "" {
			return nil, ErrRestoreToRefused
		}
		return sv.RestorePaths(ctx, r.PathValue("name"), req)
	})
	route(s, "GET /v1/lineage", func(ctx context.Context, _ *http.Request, _ none) (*api.Lineage, error) {
		return sv.Lineage(ctx)
	})
	route(s, "GET /v1/sandboxes/{name}/ps", func(ctx context.Context, r *http.Request, _ none) (*api.ProcessList, error) {
		return sv.Processes(ctx, r.PathValue("name"))
	})
	route(s, "POST /v1/forget", func(ctx context.Context, _ *http.Request, req api.ForgetRequest) (*api.Forgotten, error) {
		return sv.Forget(ctx, req)
	})
	route(s, "GET /v1/policies", func(ctx context.Context, r *http.Request, _ none) (*api.PolicyView, error) {
		return sv.ShowPolicies(ctx, r.URL.Query().Get("sandbox"))
	})
	route(s, "PUT /v1/policies", func(ctx context.Context, _ *http.Request, req api.PolicyOptions) (*api.PolicyView, error) {
		return sv.SetPolicy(ctx, req)
	})
	route(s, "DELETE /v1/policies", func(ctx context.Context, r *http.Request, _ none) (*api.PolicyView, error) {
		return sv.ClearPolicy(ctx, r.URL.Query().Get("sandbox"))
	})
	route(s, "POST /v1/policies/apply", func(ctx context.Context, _ *http.Request, req api.ApplyPoliciesRequest) (*api.Forgotten, error) {
		return sv.ApplyPolicies(ctx, req)
	})
}

// DefaultCatStall is how long a cat waits for a client that stopped
// reading. The engine holds its home-wide shared lock while it streams, so
// a stalled reader would otherwise keep maintenance (forget, prune, gc)
// waiting forever, and every operation queued behind it.
const DefaultCatStall = 30 * time.Second

// cat streams a file's bytes (application/octet-stream). An error before
// the first byte is an ordinary problem+json response; one after it (a
// damaged chunk) can no longer change the status. A client that said it
// reads trailers (TE: trailers, as package client does) gets the error in
// the Turnsnap-Error trailer and turns it back into the error (a corrupt
// one exits 7). Any other client (curl, Python's http.client, which drop
// trailers) gets the connection aborted before the last chunk, so the
// body cannot pass for a whole file.
func (s *Server) cat(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Query().Get("path")
	cw := &catWriter{w: w, rc: http.NewResponseController(w), stall: s.catStall}
	err := s.svc.Cat(r.Context(), r.PathValue("ref"), path, cw)
	// The deadline was this response's: a next request on the kept-alive
	// connection (an hour-long exec) must not inherit it.
	cw.rc.SetWriteDeadline(time.Time{})
	if err != nil {
		s.mon.requestFailed(err)
	}
	switch {
	case err != nil && !cw.started:
		writeProblem(w, err)
	case err != nil:
		s.log.Warn("cat cut off mid-file", "checkpoint", r.PathValue("ref"), "path", path, "bytes_sent", cw.n, "err", err)
		if !acceptsTrailers(r) {
			panic(http.ErrAbortHandler) // the server closes the connection mid-body
		}
		data, _ := json.Marshal(ProblemFor(err))
		w.Header().Set(api.CatErrorTrailer, string(data))
	default:
		cw.start() // an empty file
		w.Header().Set(api.CatErrorTrailer, api.CatComplete)
	}
}

// acceptsTrailers says the client will read trailer fields (RFC 9110
// section 10.1.4).
func acceptsTrailers(r *http.Request) bool {
	for _, v := range r.Header.Values("TE") {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "trailers") {
				return true
			}
		}
	}
	return false
}

// catWriter sends the headers (200, the trailer's announcement) with the
// first byte, so an error before it can still be a problem response.
type catWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	stall   time.Duration
	started bool
	n       int64
}

func (c *catWriter) start() {
	if c.started {
		return
	}
	c.started = true
	h := c.w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Trailer", api.CatErrorTrailer)
	c.w.WriteHeader(http.StatusOK)
}

func (c *catWriter) Write(b []byte) (int, error) {
	c.start()
	// Each write gets its own deadline: a slow reader is fine, one that
	// stopped reading fails the write and the cat lets the home go.
	c.rc.SetWriteDeadline(time.Now().Add(c.stall))
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// gced publishes a gc that ran (a dry run changes nothing).
func (m *Monitor) gced(r *retention.GCReport) {
	if r != nil && !r.DryRun {
		m.changed(api.Event{Type: api.EventGC, Deleted: r.Deleted, DurationMS: r.DurationMillis})
	}
}

// forgot counts the checkpoints a retention run deleted.
func (m *Monitor) forgot(r *retention.ForgetReport) {
	if m == nil || r.CheckpointsDeleted <= 0 {
		return
	}
	m.forgotten.Add(float64(r.CheckpointsDeleted))
}
