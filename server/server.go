// Package server is turnsnap's daemon: it serves one turnsnap home over
// HTTP (JSON under /v1 in package api's wire types, errors as RFC 9457
// problem+json carrying the error class, turn events as server-sent
// events, Prometheus metrics), uploads in the background, renews the host
// lease and runs the LLM proxy. `turnsnap serve` parses its flags into a
// Config and calls Serve, which listens on the home's unix socket (and
// optionally TCP); the CLI reaches it with package client, or calls the
// same Service directly without a daemon. Package server/tenants serves
// several homes on one listener. docs/openapi.yaml describes every route.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
)

// Options configures New.
type Options struct {
	Logger *slog.Logger
	// Uploads, if set, is the background pusher: sync and wait_remote wait
	// for it, and every change kicks it.
	Uploads *Pusher
	// Monitor, if set, is the monitor to use (NewMonitor); nil makes one
	// with Collectors.
	Monitor *Monitor
	// Collectors are extra Prometheus collectors served on /metrics (the
	// change tracker's event overflows and walk fallbacks, say).
	Collectors []prometheus.Collector
	// MaxBody bounds a request's JSON body (default DefaultMaxBody).
	MaxBody int64
	// CatStall bounds how long a cat response may wait for its client to
	// take the next bytes (default DefaultCatStall; everyday.go).
	CatStall time.Duration
	// MCP, if set, makes the handler of the MCP endpoint
	// /v1/sandboxes/{name}/mcp (streamable HTTP) from the server's
	// service: package mcpserver's Handler, which imports this package
	// for its types and so is passed in rather than imported.
	MCP func(*Service) http.Handler
}

// DefaultMaxBody is far above any request's JSON (the largest is an exec
// with inline stdin) and far below what would hurt the daemon.
const DefaultMaxBody = 8 << 20

// Server is the API's http.Handler.
type Server struct {
	svc      *Service
	mux      *http.ServeMux
	mon      *Monitor
	log      *slog.Logger
	pusher   *Pusher
	maxBody  int64
	catStall time.Duration
	patterns []string
	mcp      func(*Service) http.Handler
}

// New serves e.
func New(e *engine.Engine, opts Options) (*Server, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	mon := opts.Monitor
	if mon == nil {
		var err error
		if mon, err = NewMonitor(log, e, opts.Collectors...); err != nil {
			return nil, err
		}
	}
	s := &Server{mux: http.NewServeMux(), mon: mon, log: log, pusher: opts.Uploads, maxBody: opts.MaxBody, mcp: opts.MCP}
	if s.maxBody <= 0 {
		s.maxBody = DefaultMaxBody
	}
	if s.catStall = opts.CatStall; s.catStall <= 0 {
		s.catStall = DefaultCatStall
	}
	s.svc = &Service{E: e, Monitor: mon}
	if opts.Uploads != nil {
		s.svc.Uploads = opts.Uploads
	}
	s.routes()
	return s, nil
}

// Service is the service the server calls.
func (s *Server) Service() *Service { return s.svc }

// Monitor is the server's monitor (events, metrics).
func (s *Server) Monitor() *Monitor { return s.mon }

// Routes lists every registered pattern ("METHOD /path"), sorted.
func (s *Server) Routes() []string {
	out := append([]string(nil), s.patterns...)
	sort.Strings(out)
	return out
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v) // a deliberate abort (cat cut off): net/http drops the connection
			}
			// A bug must cost one request, never the daemon and its sandboxes.
			s.log.Error("panic serving request", "method", r.Method, "path", r.URL.Path, "panic", v)
			if !rec.wrote {
				writeProblem(rec, errors.New("internal error"))
			}
		}
		if r.URL.Path == "/metrics" || r.URL.Path == "/healthz" {
			return
		}
		s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "status", rec.status,
			"sandbox", r.PathValue("name"), "checkpoint", r.PathValue("ref"), "duration", time.Since(start))
	}()
	s.mux.ServeHTTP(rec, r)
}

// statusWriter remembers the status for the log line; it keeps Flush and
// the ResponseController's access to the connection (Unwrap).
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	w.wrote = true
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// none is the request type of routes without a body.
type none struct{}

// handle registers pattern (a ServeMux pattern with its method) for a
// plain handler.
func (s *Server) handle(pattern string, h http.HandlerFunc) {
	s.patterns = append(s.patterns, pattern)
	s.mux.HandleFunc(pattern, h)
}

// route registers a JSON route: the body (none for GET and DELETE, which
// take none) is decoded strictly into Req (at most MaxBody bytes, unknown
// fields refused, one JSON value), fn's result is the 200 response and its
// error a problem+json. Path values named "name" must be valid sandbox
// names. Adding an engine method to the API is one call (everyday.go has
// a dozen, a streamed one among them):
//
//	route(s, "GET /v1/sandboxes/{name}/ps", func(ctx context.Context, r *http.Request, _ none) (*api.ProcessList, error) {
//		return s.svc.Processes(ctx, r.PathValue("name"))
//	})
//
// plus the Service method (service.go, returning the wire type the CLI
// prints with --json), the client method (client/client.go, one call of
// do), the CLI's service interface (cmd/turnsnap/service.go) and the
// route's entry in docs/openapi.yaml (TestOpenAPICoversRoutes fails
// without it).
func route[Req, Resp any](s *Server, pattern string, fn func(ctx context.Context, r *http.Request, req Req) (Resp, error)) {
	s.handle(pattern, func(w http.ResponseWriter, r *http.Request) {
		var req Req
		if err := s.decode(w, r, &req); err != nil {
			writeProblem(w, err)
			return
		}
		if strings.Contains(pattern, "{name}") {
			if _, err := delta.ParseSandboxName(r.PathValue("name")); err != nil {
				writeProblem(w, err)
				return
			}
		}
		resp, err := fn(r.Context(), r, req)
		if err != nil {
			s.mon.requestFailed(err)
			writeProblem(w, err)
			return
		}
		if s.pusher != nil && r.Method != http.MethodGet {
			s.pusher.Kick() // whatever it queued goes up without a sync
		}
		writeJSON(w, http.StatusOK, resp)
	})
}

func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) error {
	if _, ok := v.(*none); ok || r.Method == http.MethodGet || r.Method == http.MethodDelete {
		return nil
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, s.maxBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if errors.Is(err, io.EOF) {
		return nil // no body: every field takes its default
	}
	if err == nil && dec.More() {
		err = errors.New("more than one JSON value")
	}
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return invalidf("request body over %d bytes", tooBig.Limit)
	}
	if err != nil {
		return invalidf("request body: %v", err)
	}
	return nil
}

// mcpRoutes mounts Options.MCP on /v1/sandboxes/{name}/mcp: POST carries
// the JSON-RPC messages; GET and DELETE are the transport's too (a
// stateless handler answers them 405, which clients expect, where the
// catch-all would say 404). Whatever a tool call queued goes up without a
// sync, as after any other changing route.
func (s *Server) mcpRoutes() {
	if s.mcp == nil {
		return
	}
	h := s.mcp(s.svc)
	for _, method := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
		s.handle(method+" /v1/sandboxes/{name}/mcp", func(w http.ResponseWriter, r *http.Request) {
			if _, err := delta.ParseSandboxName(r.PathValue("name")); err != nil {
				writeProblem(w, err)
				return
			}
			h.ServeHTTP(w, r)
			if s.pusher != nil && r.Method == http.MethodPost {
				s.pusher.Kick()
			}
		})
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func (s *Server) routes() {
	sv := s.svc
	route(s, "POST /v1/sandboxes", func(ctx context.Context, _ *http.Request, req api.CreateRequest) (*api.Created, error) {
		return sv.CreateSandbox(ctx, req)
	})
	route(s, "GET /v1/sandboxes", func(ctx context.Context, _ *http.Request, _ none) ([]api.Sandbox, error) {
		return sv.ListSandboxes(ctx)
	})
	route(s, "GET /v1/sandboxes/{name}", func(ctx context.Context, r *http.Request, _ none) (*api.Sandbox, error) {
		return sv.GetSandbox(ctx, r.PathValue("name"))
	})
	route(s, "DELETE /v1/sandboxes/{name}", func(ctx context.Context, r *http.Request, _ none) (*api.Removed, error) {
		// ?catalog_only=true forgets a sandbox whose root is on another host.
		return sv.RemoveSandbox(ctx, r.PathValue("name"), r.URL.Query().Get("catalog_only") == "true")
	})
	route(s, "POST /v1/sandboxes/{name}/mount", func(ctx context.Context, r *http.Request, _ none) (*api.SandboxPath, error) {
		return sv.SandboxPath(ctx, r.PathValue("name"))
	})
	route(s, "POST /v1/sandboxes/{name}/adopt", func(ctx context.Context, r *http.Request, req api.AdoptRequest) (*api.Adopted, error) {
		return sv.AdoptSandbox(ctx, r.PathValue("name"), req)
	})
	route(s, "POST /v1/sandboxes/{name}/resume", func(ctx context.Context, r *http.Request, _ none) (*api.Resumed, error) {
		return sv.ResumeSandbox(ctx, r.PathValue("name"))
	})
	s.handle("POST /v1/sandboxes/{name}/exec", s.exec)
	route(s, "POST /v1/sandboxes/{name}/checkpoints", func(ctx context.Context, r *http.Request, req api.CheckpointRequest) (*api.Checkpoint, error) {
		return sv.Checkpoint(ctx, r.PathValue("name"), req)
	})
	route(s, "GET /v1/sandboxes/{name}/checkpoints", func(ctx context.Context, r *http.Request, _ none) ([]api.LogEntry, error) {
		return sv.Log(ctx, r.PathValue("name"))
	})
	s.everydayRoutes() // everyday.go: diff, cat, ls, restore, lineage, ps, forget, policies
	route(s, "GET /v1/sandboxes/{name}/audit", func(ctx context.Context, r *http.Request, _ none) (*api.AuditReport, error) {
		return sv.Audit(ctx, r.PathValue("name"))
	})
	route(s, "POST /v1/sandboxes/{name}/rollback", func(ctx context.Context, r *http.Request, req api.RollbackRequest) (*api.Restore, error) {
		return sv.Rollback(ctx, r.PathValue("name"), req)
	})
	route(s, "GET /v1/checkpoints/{ref}", func(ctx context.Context, r *http.Request, _ none) (*api.LogEntry, error) {
		return sv.GetCheckpoint(ctx, r.PathValue("ref"))
	})
	route(s, "POST /v1/checkpoints/{ref}/verify", func(ctx context.Context, r *http.Request, _ none) (*api.Verified, error) {
		return sv.Verify(ctx, r.PathValue("ref"))
	})
	route(s, "POST /v1/checkpoints/{ref}/branches", func(ctx context.Context, r *http.Request, req api.BranchRequest) ([]api.Restore, error) {
		return sv.Branch(ctx, r.PathValue("ref"), req)
	})
	route(s, "POST /v1/store/verify", func(ctx context.Context, _ *http.Request, req api.StoreVerifyRequest) (*api.StoreVerified, error) {
		return sv.VerifyStore(ctx, req)
	})
	route(s, "GET /v1/tags", func(ctx context.Context, _ *http.Request, _ none) ([]api.Tag, error) {
		return sv.Tags(ctx)
	})
	route(s, "PUT /v1/tags/{tag}", func(ctx context.Context, r *http.Request, req api.TagRequest) (*api.Tagged, error) {
		return sv.SetTag(ctx, r.PathValue("tag"), req)
	})
	route(s, "DELETE /v1/tags/{tag}", func(ctx context.Context, r *http.Request, _ none) (*api.Untagged, error) {
		return sv.DeleteTag(ctx, r.PathValue("tag"))
	})
	route(s, "GET /v1/status", func(ctx context.Context, _ *http.Request, _ none) (*api.StatusReport, error) {
		return sv.Status(ctx)
	})
	route(s, "POST /v1/sync", func(ctx context.Context, _ *http.Request, req api.SyncRequest) (*api.Synced, error) {
		return sv.Sync(ctx, req)
	})
	route(s, "POST /v1/prune", func(ctx context.Context, _ *http.Request, req api.PruneRequest) (*api.Pruned, error) {
		return sv.Prune(ctx, req)
	})
	route(s, "POST /v1/gc", func(ctx context.Context, _ *http.Request, req api.GCRequest) (*api.GCReport, error) {
		return sv.GC(ctx, req)
	})
	route(s, "POST /v1/init", func(ctx context.Context, _ *http.Request, req api.InitRequest) (*api.Initialised, error) {
		return sv.Init(ctx, req)
	})
	route(s, "POST /v1/catalog/rebuild", func(ctx context.Context, _ *http.Request, req api.RebuildRequest) (*api.Rebuilt, error) {
		return sv.RebuildCatalog(ctx, req)
	})
	s.llmRoutes()
	s.mcpRoutes()
	s.handle("GET /v1/events", s.events)
	s.handle("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "home": sv.E.Home()})
	})
	s.handle("GET /metrics", promhttp.HandlerFor(s.mon.Registry(), promhttp.HandlerOpts{}).ServeHTTP)
	// Anything else is a problem too, not the mux's plain-text 404.
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, notFoundf("no route %s %s", r.Method, r.URL.Path))
	})
}
