package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/proc"
)

// An agent inside its sandbox reaches the daemon's LLM proxy on the
// container's own loopback (proc.AgentLLMAddr; docs/LLM-PROXY.md, "An
// agent inside its sandbox"): the container has no other network, and the
// proxy listens on the host's loopback. The daemon opens that route once
// it finds the container running (an exec prepared it, a restore brought
// it back) and serves there the proxy of that sandbox only.

// routeCheck is how often the routes are checked against their
// containers: a container gone closes its route, a container restored
// meanwhile (a new network namespace) gets its route anew.
const routeCheck = 2 * time.Second

// agentRoutes are the open routes, by sandbox.
type agentRoutes struct {
	mu     sync.Mutex
	m      map[string]*agentRoute
	watch  sync.Once
	stop   chan struct{}
	closed bool // the proxy closed: no more routes
	// api serves the sandbox's MCP endpoint through its route (the
	// daemon's API handler, without the TCP listener's token: the route
	// passes one path only); nil: MCP is not routed.
	api http.Handler
}

// agentRoute is one route: the listener in the network namespace
// identified by ns (the pinned namespace's device and inode).
type agentRoute struct {
	ns  [2]uint64
	srv *http.Server
}

// netnsID identifies the namespace pinned at path; ok is false when
// nothing is pinned there (no container).
func netnsID(path string) (id [2]uint64, ok bool) {
	fi, err := os.Stat(path)
	if err != nil {
		return id, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return id, false
	}
	return [2]uint64{uint64(st.Dev), st.Ino}, true
}

// routeAgent opens sandbox's route in its container's network namespace
// unless it is open there already, and closes a route whose container is
// gone. A nil LLM (no proxy served) does nothing. Failing to open it is
// logged, not returned: the command or restore that called it goes on
// (a process of the sandbox may hold the address).
func (l *LLM) routeAgent(ctx context.Context, name delta.SandboxName) {
	if l == nil {
		return
	}
	sandbox := string(name)
	procs := l.svc.E.Processes()
	rt, err := procs.Runtime(ctx)
	if err != nil {
		return // no process runtime on this host: no containers
	}
	path := rt.NetnsPath(procs.ContainerID(sandbox))
	r := &l.routes
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	ns, running := netnsID(path)
	old := r.m[sandbox]
	if old != nil && running && old.ns == ns {
		return
	}
	if old != nil {
		old.srv.Close()
		delete(r.m, sandbox)
	}
	if !running {
		return
	}
	ln, err := proc.ListenInNetns(path, proc.AgentLLMAddr)
	if err != nil {
		l.log.Warn("cannot open the LLM proxy's route in the sandbox", "sandbox", sandbox, "addr", proc.AgentLLMAddr, "err", err)
		return
	}
	srv := &http.Server{Handler: l.agentHandler(sandbox), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(l.log.Handler(), slog.LevelWarn)}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			l.log.Warn("the LLM proxy's route in the sandbox ended", "sandbox", sandbox, "err", err)
		}
	}()
	if r.m == nil {
		r.m = map[string]*agentRoute{}
		r.stop = make(chan struct{})
	}
	r.m[sandbox] = &agentRoute{ns: ns, srv: srv}
	r.watch.Do(func() { go l.watchRoutes(r.stop) })
}

// agentHandler is the proxy as sandbox's route serves it: its own routes
// only, and its own MCP endpoint. The proxy takes the sandbox from the path up to its next slash
// and refuses dot segments after it, so the prefix decides.
func (l *LLM) agentHandler(sandbox string) http.Handler {
	prefix, mcp := "/llm/"+sandbox+"/", "/v1/sandboxes/"+sandbox+"/mcp"
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.EscapedPath() == mcp && l.routes.api != nil {
			l.routes.api.ServeHTTP(w, r)
			return
		}
		if !strings.HasPrefix(r.URL.EscapedPath(), prefix) {
			writeRouteRefusal(w, sandbox)
			return
		}
		l.proxy.ServeHTTP(w, r)
	})
}

func writeRouteRefusal(w http.ResponseWriter, sandbox string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(http.StatusForbidden)
	w.Write([]byte(`{"title":"Not this sandbox's route","status":403,"detail":"from inside sandbox ` + sandbox +
		`, the daemon serves /llm/` + sandbox + `/ and /v1/sandboxes/` + sandbox + `/mcp only"}`))
}

// watchRoutes keeps the routes in step with their containers until stop
// is closed.
func (l *LLM) watchRoutes(stop <-chan struct{}) {
	t := time.NewTicker(routeCheck)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		l.routes.mu.Lock()
		names := make([]string, 0, len(l.routes.m))
		for name := range l.routes.m {
			names = append(names, name)
		}
		l.routes.mu.Unlock()
		for _, name := range names {
			l.routeAgent(context.Background(), delta.SandboxName(name)) // a name routeAgent was given
		}
	}
}

// closeRoutes closes every route, and stops their watch.
func (r *agentRoutes) closeRoutes() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, rt := range r.m {
		rt.srv.Close()
		delete(r.m, name)
	}
	if r.stop != nil {
		close(r.stop)
	}
	r.closed = true
}
