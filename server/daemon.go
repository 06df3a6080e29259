package server

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
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// SocketName is the daemon's unix socket inside the home.
const SocketName = "turnsnap.sock"

// Config is what `turnsnap serve` asks of the daemon; the command parses
// its flags into one (cmd/turnsnap/serve.go says what each flag means).
type Config struct {
	Home     string        // --home (unused with tenants: each has its own)
	LockWait time.Duration // --lock-wait
	// LogFormat is text or json; Verbose adds debug lines.
	LogFormat string
	Verbose   bool
	// SocketGroup, if set, makes the socket 0660 for this group.
	SocketGroup string
	// Listen also serves TCP on HOST:PORT; every request there needs the
	// bearer token in TokenFile, and a non-loopback address needs TLS.
	Listen          string
	TokenFile       string
	TLSCert, TLSKey string
	// ShutdownTimeout is how long requests in flight may take to finish
	// once ctx ends.
	ShutdownTimeout time.Duration
	// ForgetInterval applies the stored retention policies this often
	// (0: never).
	ForgetInterval time.Duration
	// CheckpointSlots bounds the checkpoints that run at once (0: one per
	// CPU, -1: no limit).
	CheckpointSlots int
	// EventRing is how many recent events are kept for clients that
	// resume (DefaultEventRing).
	EventRing int
	// LeaseTTL is the host lease's TTL in the shared bucket.
	LeaseTTL time.Duration
	LLM      LLMConfig
	// AtPhase, if set, is called at each phase of the engine's operations
	// (the CLI's kill-point test hook).
	AtPhase func(phase string)
	// MCP, if set, makes the MCP endpoint of a home's service
	// (Options.MCP), logging to the daemon's log.
	MCP func(log *slog.Logger) func(*Service) http.Handler
}

// MCPFor is Options.MCP for a home whose log is log.
func (f Config) MCPFor(log *slog.Logger) func(*Service) http.Handler {
	if f.MCP == nil {
		return nil
	}
	return f.MCP(log)
}

// Open opens the home a daemon serves (a tenant's, or Config.Home). The
// engine's work must outlive ctx (SIGTERM cancels it): requests in flight
// finish on their own contexts, the pusher on its own.
func (f Config) Open(ctx context.Context, home string, log *slog.Logger) (*engine.Engine, error) {
	return engine.Open(context.WithoutCancel(ctx), engine.Options{Home: home, LockWait: f.LockWait, Logger: log,
		AtPhase: chainPhases(f.AtPhase, holdAtPhase()), TrackChanges: true, MaxCheckpoints: f.CheckpointSlots})
}

// CheckListen applies the TCP rules before anything is opened.
func (f Config) CheckListen() error {
	if f.Listen == "" {
		if f.TokenFile != "" || f.TLSCert != "" || f.TLSKey != "" {
			return fmt.Errorf("serve: --token-file and --tls-* are for --listen: %w", errdefs.ErrInvalid)
		}
		return nil
	}
	host, _, err := net.SplitHostPort(f.Listen)
	if err != nil {
		return fmt.Errorf("serve: --listen %q: %v: %w", f.Listen, err, errdefs.ErrInvalid)
	}
	if f.TokenFile == "" {
		return fmt.Errorf("serve: --listen needs --token-file (every TCP request must carry its bearer token): %w", errdefs.ErrInvalid)
	}
	if (f.TLSCert == "") != (f.TLSKey == "") {
		return fmt.Errorf("serve: --tls-cert and --tls-key go together: %w", errdefs.ErrInvalid)
	}
	if f.TLSCert == "" && !loopback(host) {
		return fmt.Errorf("serve: refusing --listen %s without TLS: the bearer token would cross the network in clear (give --tls-cert and --tls-key, or listen on 127.0.0.1 or [::1]): %w", f.Listen, errdefs.ErrInvalid)
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

func ReadToken(path string) ([]byte, error) {
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

// RequireToken lets a request through only with the bearer token, compared
// in constant time.
func RequireToken(h http.Handler, token []byte) http.Handler {
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

// NewLogger is the daemon's logger on stderr: format is text or json
// (serve --log-format), debug lines too when verbose.
func NewLogger(format string, verbose bool) (*slog.Logger, error) {
	level := slog.LevelInfo
	if verbose {
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

// ListenSocket makes HOME/turnsnap.sock, replacing one a killed daemon
// left (this process holds the home's lock, so no daemon uses it).
func ListenSocket(home, group string) (net.Listener, string, error) {
	sock := filepath.Join(home, SocketName)
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

// Serve is `turnsnap serve` for one home: it opens the home, repairs what
// a killed turnsnap left (beside serving), uploads in the background,
// renews the host lease, serves the API on the home's unix socket (and
// TCP with Listen, the LLM proxy with LLM.Listen) until ctx ends, then
// lets requests in flight finish (ShutdownTimeout) and returns nil.
// Sandboxes and their processes keep running.
func Serve(ctx context.Context, f Config) error {
	if err := f.CheckListen(); err != nil {
		return err
	}
	if err := f.LLM.check(); err != nil {
		return err
	}
	log, err := NewLogger(f.LogFormat, f.Verbose)
	if err != nil {
		return err
	}
	if err := CheckForgetInterval(f.ForgetInterval); err != nil {
		return err
	}
	var token []byte
	if f.Listen != "" {
		if token, err = ReadToken(f.TokenFile); err != nil {
			return err
		}
	}
	e, err := f.Open(ctx, f.Home, log)
	if err != nil {
		return err
	}
	defer e.Close()
	// Recovery runs beside serving: each sandbox's repair holds only that
	// sandbox's lock, so the others are served at once (a request for one
	// not yet repaired repairs it itself).
	defer RecoverInBackground(ctx, log, e)()

	mon, err := NewMonitor(log, e, ExtraCollectors(e)...)
	if err != nil {
		return err
	}
	mon.SetRing(f.EventRing)
	pushCtx, stopPush := context.WithCancel(context.WithoutCancel(ctx))
	pusher := NewPusher(e, mon, log)
	var pushWG sync.WaitGroup
	pushWG.Add(1)
	go func() { defer pushWG.Done(); pusher.Run(pushCtx) }()
	defer func() { stopPush(); pushWG.Wait() }()
	// The host lease says this home is alive, so that other homes do not
	// adopt its sandboxes without --force.
	pushWG.Add(1)
	go func() { defer pushWG.Done(); RunLease(pushCtx, e, f.LeaseTTL, log) }()
	pushWG.Add(1)
	go func() { defer pushWG.Done(); RunLockSweeper(pushCtx, e, log) }()

	srvAPI, err := New(e, Options{Logger: log, Uploads: pusher, Monitor: mon, MCP: f.MCPFor(log)})
	if err != nil {
		return err
	}
	sl, sock, err := ListenSocket(f.Home, f.SocketGroup)
	if err != nil {
		return err
	}
	unixSrv := &http.Server{Handler: srvAPI, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	unixSrv.RegisterOnShutdown(mon.CloseSubscribers)
	servers := []*http.Server{unixSrv}
	errc := make(chan error, 3)
	stopLLM, err := startLLM(ctx, log, srvAPI, f.LLM, errc)
	if err != nil {
		sl.Close() // not served yet: closing it removes the socket
		return err
	}
	go func() { errc <- unixSrv.Serve(sl) }()
	log.Info("serving", "home", f.Home, "socket", sock)
	forgetCtx, stopForget := context.WithCancel(ctx)
	waitForget := forgetOnSchedule(forgetCtx, log, srvAPI.Service(), f.ForgetInterval)
	defer func() { stopForget(); waitForget() }()
	if f.Listen != "" {
		tl, err := net.Listen("tcp", f.Listen)
		if err != nil {
			unixSrv.Close()
			return fmt.Errorf("serve: %w", err)
		}
		tcpSrv := &http.Server{Handler: RequireToken(srvAPI, token), ReadHeaderTimeout: 10 * time.Second,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
		tcpSrv.RegisterOnShutdown(mon.CloseSubscribers)
		servers = append(servers, tcpSrv)
		if f.TLSCert != "" {
			cert, err := tls.LoadX509KeyPair(f.TLSCert, f.TLSKey)
			if err != nil {
				unixSrv.Close()
				tl.Close()
				return fmt.Errorf("serve: TLS: %v: %w", err, errdefs.ErrInvalid)
			}
			tcpSrv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
			tl = tls.NewListener(tl, tcpSrv.TLSConfig)
		}
		go func() { errc <- tcpSrv.Serve(tl) }()
		log.Info("serving TCP", "addr", tl.Addr().String(), "tls", f.TLSCert != "")
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	}
	// Stop accepting; let requests in flight (a checkpoint committing)
	// finish. Sandboxes and their processes keep running.
	sctx, cancel := context.WithTimeout(context.Background(), f.ShutdownTimeout)
	defer cancel()
	ShutdownServers(sctx, log, servers)
	stopLLM(sctx)
	stopPush()
	pushWG.Wait()
	log.Info("stopped")
	return nil
}

// ExtraCollectors are Prometheus collectors of the engine's parts outside
// the monitor, served on /metrics too: the change tracker's counters (a long-lived
// daemon engine tracks every overlay sandbox's changes, docs/TRACKING.md).
func ExtraCollectors(e *engine.Engine) []prometheus.Collector {
	return []prometheus.Collector{NewTrackingCollector(e)}
}

// RecoverInBackground runs e.Recover on its own goroutine and logs what
// it did; the returned function cancels it and waits for it to end.
func RecoverInBackground(ctx context.Context, log *slog.Logger, e *engine.Engine) (wait func()) {
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

// ShutdownServers stops the servers accepting and lets requests in flight
// (a checkpoint committing) finish until ctx ends; what still runs then is
// cut. Sandboxes and their processes keep running.
func ShutdownServers(ctx context.Context, log *slog.Logger, servers []*http.Server) {
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
