package main

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/engine/api"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

type serveFlags struct {
	forgetInterval  time.Duration // serve_forget.go
	socketGroup     string
	listen          string
	tokenFile       string
	tlsCert, tlsKey string
	logFormat       string
	shutdownTimeout time.Duration
	tenants         string   // tenants.go
	llm             llmFlags // run.go
	checkpointSlots int
	eventRing       int // serve --event-ring
	leaseTTL        time.Duration
}

func (a *app) serveCmd() *cobra.Command {
	var f serveFlags
	c := &cobra.Command{
		Use:   "serve [--listen ADDR --token-file F [--tls-cert C --tls-key K]] [--socket-group G]",
		Short: "Run the daemon: serve this home's API on HOME/turnsnap.sock (and TCP), upload in the background",
		Long: `serve opens the home once and keeps it (its lock, catalog, store and process
runtime) for its lifetime, serving the HTTP API (docs/openapi.yaml) on the
unix socket HOME/turnsnap.sock (mode 0600; --socket-group G makes it 0660
for group G). Every turnsnap command on this home then goes through it.

--listen ADDR also serves TCP; every request there needs the header
"Authorization: Bearer TOKEN" with the token in --token-file. A non-loopback
ADDR is refused without --tls-cert and --tls-key.

--forget-interval DUR applies the retention policies stored with 'policy
set' every DUR (as 'policy apply' does; default off), logging what each run
deleted and counting it in turnsnap_forgotten_checkpoints_total. Run
'turnsnap gc' to reclaim the space.

With a remote store, the queue is uploaded continuously in the background;
sync and checkpoint --wait-remote wait for it. At start it repairs what a
killed turnsnap left (frozen containers, half-done rollbacks) and resumes the
upload queue. SIGTERM or SIGINT: stop accepting, let requests in flight
finish (a checkpoint commits), leave sandboxes and their processes running,
exit 0.

--tenants FILE serves several homes, one per tenant, on one --listen
address: each request's bearer token picks its tenant's home, and nothing
of another tenant can be named with it (docs/SECURITY.md, "Tenants").
Each home also gets its own unix socket; --home is not used.

--checkpoint-slots N bounds the checkpoints that scan and store at once
(default one per CPU); the others queue in arrival order, except those whose
model reply is already waiting at the LLM proxy's gate, which go first
(turnsnap_checkpoint_queue_* on /metrics).

--llm-listen 127.0.0.1:PORT also serves the LLM proxy (docs/LLM-PROXY.md) at
http://ADDR/llm/{sandbox}/: each model call an agent sends there is forwarded
to the upstream (--llm-upstream, or the sandbox's own) and closes the
sandbox's turn, checkpointed during the model's latency; the reply waits for
the checkpoint (--llm-gate). turnsnap run NAME -- AGENT starts an agent
pointed at it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.serve(cmd.Context(), f) },
	}
	fl := c.Flags()
	fl.StringVar(&f.socketGroup, "socket-group", "", "make the socket 0660 for this group (name or gid)")
	fl.DurationVar(&f.forgetInterval, "forget-interval", 0, "apply the stored retention policies (policy set) this often, as 'policy apply' does (0: never)")
	fl.StringVar(&f.listen, "listen", "", "also serve TCP on ADDR (HOST:PORT), with --token-file")
	fl.StringVar(&f.tokenFile, "token-file", "", "file holding the bearer token TCP clients must send")
	fl.StringVar(&f.tlsCert, "tls-cert", "", "TLS certificate (PEM) for --listen")
	fl.StringVar(&f.tlsKey, "tls-key", "", "TLS private key (PEM) for --listen")
	fl.StringVar(&f.logFormat, "log-format", "text", "log lines as text or json (on stderr)")
	fl.StringVar(&f.tenants, "tenants", "", "serve several homes, one per tenant, as FILE lists them (with --listen; see docs/SECURITY.md)")
	fl.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 5*time.Minute, "on SIGTERM, how long requests in flight may take to finish")
	fl.DurationVar(&f.leaseTTL, "lease-ttl", delta.DefaultLeaseTTL, "host lease TTL in the shared bucket: renewed every third of it; another home adopts this one's sandboxes without --force only once it lapses")
	fl.IntVar(&f.eventRing, "event-ring", api.DefaultEventRing, "recent events kept for /v1/events clients that resume with Last-Event-ID (one away longer gets a gap event)")
	fl.IntVar(&f.checkpointSlots, "checkpoint-slots", 0, "checkpoints that run at once, the others queue (urgent ones, whose model reply waits, first); 0: one per CPU, -1: no limit")
	f.llm.register(fl)
	return c
}

// checkListen applies the TCP rules before anything is opened.
func (f serveFlags) checkListen() error {
	if f.listen == "" {
		if f.tokenFile != "" || f.tlsCert != "" || f.tlsKey != "" {
			return fmt.Errorf("serve: --token-file and --tls-* are for --listen: %w", errdefs.ErrInvalid)
		}
		return nil
	}
	host, _, err := net.SplitHostPort(f.listen)
	if err != nil {
		return fmt.Errorf("serve: --listen %q: %v: %w", f.listen, err, errdefs.ErrInvalid)
	}
	if f.tokenFile == "" {
		return fmt.Errorf("serve: --listen needs --token-file (every TCP request must carry its bearer token): %w", errdefs.ErrInvalid)
	}
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return fmt.Errorf("serve: --tls-cert and --tls-key go together: %w", errdefs.ErrInvalid)
	}
	if f.tlsCert == "" && !loopback(host) {
		return fmt.Errorf("serve: refusing --listen %s without TLS: the bearer token would cross the network in clear (give --tls-cert and --tls-key, or listen on 127.0.0.1 or [::1]): %w", f.listen, errdefs.ErrInvalid)
	}
	return nil
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func readToken(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("serve: token file: %v: %w", err, errdefs.ErrInvalid)
	}
	tok := []byte(strings.TrimSpace(string(b)))
	if len(tok) < 16 {
		return nil, fmt.Errorf("serve: token file %s: a token needs at least 16 characters: %w", path, errdefs.ErrInvalid)
	}
	return tok, nil
}

// requireToken lets a request through only with the bearer token, compared
// in constant time.
func requireToken(h http.Handler, token []byte) http.Handler {
	want := append([]byte("Bearer "), token...)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="turnsnap"`)
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"type":%q,"title":"unauthorized","status":401,"detail":"missing or wrong bearer token","class":"precondition"}`+"\n",
				api.ProblemType+"unauthorized")
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (a *app) serveLogger(format string) (*slog.Logger, error) {
	level := slog.LevelInfo
	if a.verbose {
		level = slog.LevelDebug
	}
	o := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, o)), nil
	}
	return nil, fmt.Errorf("serve: --log-format %q: want text or json: %w", format, errdefs.ErrInvalid)
}

// listenSocket makes HOME/turnsnap.sock, replacing one a killed daemon
// left (this process holds the home's lock, so no daemon uses it).
func listenSocket(home, group string) (net.Listener, string, error) {
	sock := filepath.Join(home, socketName)
	if len(sock) >= 108 { // sizeof(sockaddr_un.sun_path) on Linux, NUL included
		return nil, "", fmt.Errorf("serve: socket path %s is too long for a unix socket (at most 107 bytes); use a shorter --home: %w", sock, errdefs.ErrInvalid)
	}
	gid := -1
	if group != "" {
		g, err := user.LookupGroup(group)
		if err != nil {
			g, err = user.LookupGroupId(group)
		}
		if err != nil {
			return nil, "", fmt.Errorf("serve: --socket-group %q: %v: %w", group, err, errdefs.ErrInvalid)
		}
		gid, _ = strconv.Atoi(g.Gid)
	}
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, "", fmt.Errorf("serve: stale socket %s: %w", sock, err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, "", fmt.Errorf("serve: %w", err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(true)
	mode := os.FileMode(0o600)
	if gid >= 0 {
		mode = 0o660
		if err := os.Chown(sock, 0, gid); err != nil {
			l.Close()
			return nil, "", fmt.Errorf("serve: socket group: %w", err)
		}
	}
	if err := os.Chmod(sock, mode); err != nil {
		l.Close()
		return nil, "", fmt.Errorf("serve: %w", err)
	}
	return l, sock, nil
}

func (a *app) serve(ctx context.Context, f serveFlags) error {
	if f.tenants != "" {
		return a.serveTenants(ctx, f)
	}
	if err := f.checkListen(); err != nil {
		return err
	}
	if err := f.llm.check(); err != nil {
		return err
	}
	log, err := a.serveLogger(f.logFormat)
	if err != nil {
		return err
	}
	if err := checkForgetInterval(f.forgetInterval); err != nil {
		return err
	}
	var token []byte
	if f.listen != "" {
		if token, err = readToken(f.tokenFile); err != nil {
			return err
		}
	}
	// The engine's work must outlive ctx (SIGTERM cancels it): requests in
	// flight finish on their own contexts, the pusher on its own.
	e, err := engine.Open(context.WithoutCancel(ctx), engine.Options{Home: a.home, LockWait: a.lockWait, Logger: log,
		AtPhase: chainPhases(blockAtPhase(), holdAtPhase()), TrackChanges: true, MaxCheckpoints: f.checkpointSlots})
	if err != nil {
		return err
	}
	defer e.Close()
	// Recovery runs beside serving: each sandbox's repair holds only that
	// sandbox's lock, so the others are served at once (a request for one
	// not yet repaired repairs it itself).
	defer recoverInBackground(ctx, log, e)()

	mon, err := api.NewMonitor(log, e, extraCollectors(e)...)
	if err != nil {
		return err
	}
	mon.SetRing(f.eventRing)
	pushCtx, stopPush := context.WithCancel(context.WithoutCancel(ctx))
	pusher := api.NewPusher(e, mon, log)
	var pushWG sync.WaitGroup
	pushWG.Add(1)
	go func() { defer pushWG.Done(); pusher.Run(pushCtx) }()
	defer func() { stopPush(); pushWG.Wait() }()
	// The host lease says this home is alive, so that other homes do not
	// adopt its sandboxes without --force.
	pushWG.Add(1)
	go func() { defer pushWG.Done(); api.RunLease(pushCtx, e.Remote(), f.leaseTTL, log) }()
	pushWG.Add(1)
	go func() { defer pushWG.Done(); api.RunLockSweeper(pushCtx, e.Remote(), log) }()

	srvAPI, err := api.New(e, api.Options{Logger: log, Uploads: pusher, Monitor: mon, MCP: mcpHandler(log)})
	if err != nil {
		return err
	}
	sl, sock, err := listenSocket(a.home, f.socketGroup)
	if err != nil {
		return err
	}
	unixSrv := &http.Server{Handler: srvAPI, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	unixSrv.RegisterOnShutdown(mon.CloseSubscribers)
	servers := []*http.Server{unixSrv}
	errc := make(chan error, 3)
	stopLLM, err := startLLM(ctx, log, srvAPI, f.llm, errc)
	if err != nil {
		sl.Close() // not served yet: closing it removes the socket
		return err
	}
	go func() { errc <- unixSrv.Serve(sl) }()
	log.Info("serving", "home", a.home, "socket", sock)
	forgetCtx, stopForget := context.WithCancel(ctx)
	waitForget := forgetOnSchedule(forgetCtx, log, srvAPI.Service(), f.forgetInterval)
	defer func() { stopForget(); waitForget() }()
	if f.listen != "" {
		tl, err := net.Listen("tcp", f.listen)
		if err != nil {
			unixSrv.Close()
			return fmt.Errorf("serve: %w", err)
		}
		tcpSrv := &http.Server{Handler: requireToken(srvAPI, token), ReadHeaderTimeout: 10 * time.Second,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
		tcpSrv.RegisterOnShutdown(mon.CloseSubscribers)
		servers = append(servers, tcpSrv)
		if f.tlsCert != "" {
			cert, err := tls.LoadX509KeyPair(f.tlsCert, f.tlsKey)
			if err != nil {
				unixSrv.Close()
				tl.Close()
				return fmt.Errorf("serve: TLS: %v: %w", err, errdefs.ErrInvalid)
			}
			tcpSrv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
			tl = tls.NewListener(tl, tcpSrv.TLSConfig)
		}
		go func() { errc <- tcpSrv.Serve(tl) }()
		log.Info("serving TCP", "addr", tl.Addr().String(), "tls", f.tlsCert != "")
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	}
	// Stop accepting; let requests in flight (a checkpoint committing)
	// finish. Sandboxes and their processes keep running.
	sctx, cancel := context.WithTimeout(context.Background(), f.shutdownTimeout)
	defer cancel()
	shutdownServers(sctx, log, servers)
	stopLLM(sctx)
	stopPush()
	pushWG.Wait()
	log.Info("stopped")
	return nil
}

// extraCollectors are Prometheus collectors of parts outside engine/api
// served on /metrics too: the change tracker's counters (a long-lived
// daemon engine tracks every overlay sandbox's changes, docs/TRACKING.md).
func extraCollectors(e *engine.Engine) []prometheus.Collector {
	return []prometheus.Collector{api.NewTrackingCollector(e)}
}

// recoverInBackground runs e.Recover on its own goroutine and logs what
// it did; the returned function cancels it and waits for it to end.
func recoverInBackground(ctx context.Context, log *slog.Logger, e *engine.Engine) (wait func()) {
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		rep, err := e.Recover(rctx)
		if err != nil {
			log.Error("recovery at start failed", "err", err)
			return
		}
		logRecovery(rctx, log, e, rep)
	}()
	return func() { cancel(); <-done }
}

func logRecovery(ctx context.Context, log *slog.Logger, e *engine.Engine, rep *engine.RecoverReport) {
	for _, n := range rep.Resumed {
		log.Warn("repaired: resumed a container a killed turnsnap left frozen", "sandbox", n)
	}
	for _, n := range rep.RollbacksFinished {
		log.Warn("repaired: finished a rollback a killed turnsnap left half done", "sandbox", n)
	}
	for _, n := range rep.ProcessesLost {
		log.Error("the finished rollback's processes could not be restored (turnsnap ps says why)", "sandbox", n)
	}
	for n, msg := range rep.Failed {
		log.Error("sandbox could not be checked at start", "sandbox", n, "err", msg)
	}
	if len(rep.Running) > 0 {
		log.Info("reattached running containers", "sandboxes", strings.Join(rep.Running, ","))
	}
	if st, err := e.Status(ctx); err == nil && st.QueueDepth > 0 {
		log.Info("resuming the upload queue", "objects", st.QueueDepth, "bytes", st.PendingBytes)
	}
}

// chainPhases calls each hook in turn (nil hooks are skipped).
func chainPhases(hooks ...func(string)) func(string) {
	var hs []func(string)
	for _, h := range hooks {
		if h != nil {
			hs = append(hs, h)
		}
	}
	if len(hs) == 0 {
		return nil
	}
	return func(p string) {
		for _, h := range hs {
			h(p)
		}
	}
}

// holdAtPhaseEnv is a test hook of the daemon: TURNSNAP_TEST_HOLD_AT=PHASE:DIR
// makes a checkpoint reaching PHASE, while DIR/release does not exist,
// create DIR/held and wait until DIR/release exists, so a test can act while a commit is held (send
// SIGTERM, run another sandbox's turn) and then let it go.
const holdAtPhaseEnv = "TURNSNAP_TEST_HOLD_AT"

func holdAtPhase() func(string) {
	phase, dir, ok := strings.Cut(os.Getenv(holdAtPhaseEnv), ":")
	if !ok || dir == "" {
		return nil
	}
	return func(p string) {
		release := filepath.Join(dir, "release")
		if _, err := os.Stat(release); p != phase || err == nil {
			return // not this phase, or not armed
		}
		os.WriteFile(filepath.Join(dir, "held"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600)
		for {
			if _, err := os.Stat(release); err == nil {
				os.Remove(filepath.Join(dir, "held"))
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// shutdownServers stops the servers accepting and lets requests in flight
// (a checkpoint committing) finish until ctx ends; what still runs then is
// cut. Sandboxes and their processes keep running.
func shutdownServers(ctx context.Context, log *slog.Logger, servers []*http.Server) {
	log.Info("stopping: finishing requests in flight")
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Shutdown(ctx); err != nil {
				log.Warn("requests still running at the shutdown timeout were cut", "err", err)
				s.Close()
			}
		}()
	}
	wg.Wait()
}
