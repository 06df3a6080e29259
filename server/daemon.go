package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/testhook"
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
	// Attach are more listeners on the home's service, started once the
	// API serves and stopped at shutdown (the experimental snapshot gRPC
	// provider, package kube/snapshot, which imports this package and so
	// is passed in).
	Attach []Attachment
	// Serving, if set, is called once every listener accepts (the node
	// agent registers then, so that its endpoint answers when the
	// controller reads it). ctx ends when the daemon starts to stop.
	Serving func(ctx context.Context, s Serving)
}

// Serving is what Config.Serving learns about the running daemon.
type Serving struct {
	HomeID  string
	TCPAddr string // the TCP listener's address ("" without Listen)
	Log     *slog.Logger
}

// Attachment starts a listener on the daemon's service and returns the
// function that stops it, letting calls in flight finish until its
// context ends.
type Attachment func(ctx context.Context, svc *Service, log *slog.Logger) (stop func(context.Context), err error)

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
		AtPhase: testhook.Chain(f.AtPhase, testhook.HoldAt()), TrackChanges: true, MaxCheckpoints: f.CheckpointSlots})
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
	go func() { defer pushWG.Done(); RunLease(pushCtx, e.Remote(), f.LeaseTTL, log) }()
	pushWG.Add(1)
	go func() { defer pushWG.Done(); RunLockSweeper(pushCtx, e.Remote(), log) }()

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
	var tcpAddr string
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
		tcpAddr = tl.Addr().String()
	}
	var stops []func(context.Context)
	stopAttached := func(ctx context.Context) {
		for _, st := range stops {
			st(ctx)
		}
	}
	for _, attach := range f.Attach {
		stop, err := attach(ctx, srvAPI.Service(), log)
		if err != nil {
			for _, s := range servers {
				s.Close()
			}
			stopAttached(ctx)
			return err
		}
		stops = append(stops, stop)
	}
	if f.Serving != nil {
		f.Serving(ctx, Serving{HomeID: e.HomeID(), TCPAddr: tcpAddr, Log: log})
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		stopAttached(ctx)
		return fmt.Errorf("serve: %w", err)
	}
	// Stop accepting; let requests in flight (a checkpoint committing)
	// finish. Sandboxes and their processes keep running.
	sctx, cancel := context.WithTimeout(context.Background(), f.ShutdownTimeout)
	defer cancel()
	ShutdownServers(sctx, log, servers)
	stopAttached(sctx)
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
	if st, err := e.HomeSetup().Status(ctx); err == nil && st.QueueDepth > 0 {
		log.Info("resuming the upload queue", "objects", st.QueueDepth, "bytes", st.PendingBytes)
	}
}
