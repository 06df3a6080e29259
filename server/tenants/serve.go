package tenants

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/server"
)

// loadTenants reads and checks a tenants file and everything it names
// before any home is opened: the tokens (present, long enough, unique) and
// the remotes each home already has (equal to the file's, no two sharing a
// bucket prefix).
func loadTenants(path string) (*TenantsFile, [][]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("serve: --tenants: %v: %w", err, errdefs.ErrInvalid)
	}
	data, err := io.ReadAll(io.LimitReader(fh, MaxTenantsFileBytes+1))
	fh.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("serve: --tenants %s: %w", path, err)
	}
	tf, err := DecodeTenants(data)
	if err != nil {
		return nil, nil, fmt.Errorf("serve: %s: %w", path, err)
	}
	tokens := make([][]byte, len(tf.Tenants))
	for i, t := range tf.Tenants {
		if tokens[i], err = readTenantToken(t.TokenFile); err != nil {
			return nil, nil, fmt.Errorf("serve: tenant %s: %w", t.Name, err)
		}
	}
	if err := CheckTenantTokens(tf.Tenants, tokens); err != nil {
		return nil, nil, fmt.Errorf("serve: %w", err)
	}
	remotes := map[string]*engine.RemoteConfig{}
	for _, t := range tf.Tenants {
		have, err := homeRemote(t.Home)
		if err != nil {
			return nil, nil, fmt.Errorf("serve: tenant %s: %w", t.Name, err)
		}
		if have != nil && t.Remote != nil && (have.URL != t.Remote.URL || have.Endpoint != t.Remote.Endpoint) {
			return nil, nil, fmt.Errorf("serve: tenant %s: home %s uses remote %s at %s, the tenants file says %s at %s: %w",
				t.Name, t.Home, have.URL, have.Endpoint, t.Remote.URL, t.Remote.Endpoint, errdefs.ErrInvalid)
		}
		remotes[t.Name] = t.Remote
		if have != nil {
			remotes[t.Name] = have
		}
	}
	if err := CheckTenantRemotes(tf.Tenants, remotes); err != nil {
		return nil, nil, fmt.Errorf("serve: %w", err)
	}
	return tf, tokens, nil
}

// maxTokenFile bounds a token file: a token is a line, not a file's worth.
const maxTokenFile = 4096

// readTenantToken reads a token file (its content, trimmed); its length is
// checked by CheckTenantTokens.
func readTenantToken(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %v: %w", err, errdefs.ErrInvalid)
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, maxTokenFile+1))
	if err != nil {
		return nil, fmt.Errorf("token file %s: %v: %w", path, err, errdefs.ErrInvalid)
	}
	if len(b) > maxTokenFile {
		return nil, fmt.Errorf("token file %s: over %d bytes: %w", path, maxTokenFile, errdefs.ErrInvalid)
	}
	return bytes.TrimSpace(b), nil
}

// homeRemote is the remote a home's config names (nil: none, or no home yet).
func homeRemote(home string) (*engine.RemoteConfig, error) {
	data, err := os.ReadFile(home + "/config.json")
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var c engine.Config
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("home %s: config: %v: %w", home, err, errdefs.ErrInvalid)
	}
	return c.Remote, nil
}

// tenantHome is one tenant's open home: its engine, pusher and servers.
type tenantHome struct {
	spec   TenantSpec
	e      *engine.Engine
	mon    *server.Monitor
	srv    *server.Server
	unix   *http.Server
	stop   context.CancelFunc
	pushWG sync.WaitGroup
	// recovered cancels and waits for the home's recovery at start.
	recovered func()
}

func (th *tenantHome) close() {
	if th.stop != nil {
		th.stop()
		th.pushWG.Wait()
	}
	if th.recovered != nil {
		th.recovered()
	}
	th.e.Close()
}

// openTenant opens a tenant's home, repairs what a killed daemon left,
// gives it the file's key and remote if it has none yet, and starts its
// background pusher.
func openTenant(ctx context.Context, log *slog.Logger, cfg server.Config, spec TenantSpec) (*tenantHome, error) {
	log = log.With("tenant", spec.Name)
	e, err := cfg.Open(ctx, spec.Home, log) // each home has its own checkpoint slots
	if err != nil {
		return nil, fmt.Errorf("tenant %s: %w", spec.Name, err)
	}
	th := &tenantHome{spec: spec, e: e}
	fail := func(err error) (*tenantHome, error) {
		th.close()
		return nil, fmt.Errorf("tenant %s: %w", spec.Name, err)
	}
	th.recovered = server.RecoverInBackground(context.WithoutCancel(ctx), log, e)
	var setup engine.SetupOptions
	if spec.Remote != nil && !e.Remote().HasRemote() {
		rc := *spec.Remote
		setup.Remote = &rc
	}
	if spec.KeyFile != "" {
		setup.KeyFile = spec.KeyFile // the engine refuses a key other than the home's
	}
	if setup.Remote != nil || setup.KeyFile != "" {
		if _, err := e.HomeSetup().Setup(ctx, setup); err != nil {
			return fail(err)
		}
	}
	if th.mon, err = server.NewMonitor(log, e, server.ExtraCollectors(e)...); err != nil {
		return fail(err)
	}
	pushCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	th.stop = stop
	pusher := server.NewPusher(e, th.mon, log)
	th.pushWG.Add(1)
	go func() { defer th.pushWG.Done(); pusher.Run(pushCtx) }()
	if th.srv, err = server.New(e, server.Options{Logger: log, Uploads: pusher, Monitor: th.mon, MCP: cfg.MCPFor(log)}); err != nil {
		return fail(err)
	}
	return th, nil
}

// Serve is `serve --tenants FILE`: one daemon, several homes, as the
// tenants file lists them (f.Home is not used). Each home gets its own
// unix socket (for the host's tools, no token); the TCP listener routes
// each request by its bearer token to that tenant's engine, so a token
// reaches nothing of another tenant.
func Serve(ctx context.Context, f server.Config, file string) error {
	if f.Listen == "" {
		return fmt.Errorf("serve: --tenants needs --listen (tenants are told apart by their tokens on TCP): %w", errdefs.ErrInvalid)
	}
	if f.TokenFile != "" {
		return fmt.Errorf("serve: with --tenants each tenant has its token_file; --token-file is for one home: %w", errdefs.ErrInvalid)
	}
	// The proxy routes a model call by the sandbox name in its path and
	// carries the provider's key, not a tenant's token: it could not tell
	// whose sandbox "s" is. Refused rather than ignored.
	if f.LLM.Listen != "" {
		return fmt.Errorf("serve: --llm-listen serves one home's sandboxes and cannot tell tenants apart; "+
			"run a serve --llm-listen per tenant home instead of --tenants: %w", errdefs.ErrInvalid)
	}
	g := f
	g.TokenFile = file // the listener's TLS and address rules
	if err := g.CheckListen(); err != nil {
		return err
	}
	log, err := server.NewLogger(f.LogFormat, f.Verbose)
	if err != nil {
		return err
	}
	tf, tokens, err := loadTenants(file)
	if err != nil {
		return err
	}
	var homes []string
	for _, t := range tf.Tenants {
		homes = append(homes, t.Home)
	}
	var ths []*tenantHome
	defer func() {
		for _, th := range ths {
			th.close()
		}
	}()
	var routed []Tenant
	for i, spec := range tf.Tenants {
		th, err := openTenant(ctx, log, f, spec)
		if err != nil {
			return err
		}
		ths = append(ths, th)
		routed = append(routed, Tenant{Name: spec.Name, Token: tokens[i], Handler: NewTenantGuard(th.srv, spec, homes)})
	}
	router, err := NewTenantRouter(routed)
	if err != nil {
		return err
	}
	errc := make(chan error, len(ths)+1)
	var servers []*http.Server
	newServer := func(h http.Handler) *http.Server {
		return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	}
	// A listener is closed here as well as by its server's Close: one whose
	// Serve has not started yet would be missed by Close alone (and its
	// socket file left behind).
	var listeners []net.Listener
	closeAll := func() {
		for _, s := range servers {
			s.Close()
		}
		for _, l := range listeners {
			l.Close()
		}
	}
	for _, th := range ths {
		sl, sock, err := server.ListenSocket(th.spec.Home, f.SocketGroup)
		if err != nil {
			closeAll()
			return err
		}
		listeners = append(listeners, sl)
		th.unix = newServer(th.srv)
		th.unix.RegisterOnShutdown(th.mon.CloseSubscribers)
		servers = append(servers, th.unix)
		go func() { errc <- th.unix.Serve(sl) }()
		log.Info("serving", "tenant", th.spec.Name, "home", th.spec.Home, "socket", sock)
	}
	tl, err := net.Listen("tcp", f.Listen)
	if err != nil {
		closeAll()
		return fmt.Errorf("serve: %w", err)
	}
	tcpSrv := newServer(router)
	for _, th := range ths {
		tcpSrv.RegisterOnShutdown(th.mon.CloseSubscribers)
	}
	if f.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(f.TLSCert, f.TLSKey)
		if err != nil {
			closeAll()
			tl.Close()
			return fmt.Errorf("serve: TLS: %v: %w", err, errdefs.ErrInvalid)
		}
		tcpSrv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		tl = tls.NewListener(tl, tcpSrv.TLSConfig)
	}
	servers = append(servers, tcpSrv)
	go func() { errc <- tcpSrv.Serve(tl) }()
	log.Info("serving TCP", "addr", tl.Addr().String(), "tls", f.TLSCert != "", "tenants", len(ths))
	select {
	case <-ctx.Done():
	case err := <-errc:
		closeAll()
		return fmt.Errorf("serve: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), f.ShutdownTimeout)
	defer cancel()
	server.ShutdownServers(sctx, log, servers)
	log.Info("stopped")
	return nil
}
