package server_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/client"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/mcpserver"
	"github.com/turnsnap/turnsnap/server"
)

// These tests need root and overlayfs: they serve a real engine on real
// sandboxes, over HTTP on a real unix socket.

type fixture struct {
	e    *engine.Engine
	srv  *server.Server
	c    *client.Client
	sock string
	base string
}

// serve opens an engine on a new home (with hook as its AtPhase) and
// serves it on a unix socket in the test's temp dir.
func serve(t testing.TB, hook func(string), opts ...func(*engine.Options)) *fixture {
	t.Helper()
	testenv.RequireRoot(t)
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	eo := engine.Options{Home: filepath.Join(dir, "home"), AtPhase: hook, Logger: log}
	for _, o := range opts {
		o(&eo)
	}
	e, err := engine.Open(context.Background(), eo)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(e, server.Options{Logger: log, MCP: func(s *server.Service) http.Handler {
		return mcpserver.Handler(s, mcpserver.Options{Logger: log})
	}})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv}
	go hs.Serve(l)
	c, err := client.New(client.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, "base")
	os.MkdirAll(filepath.Join(base, "src"), 0o755)
	os.WriteFile(filepath.Join(base, "src", "a.txt"), []byte("base\n"), 0o644)
	f := &fixture{e: e, srv: srv, c: c, sock: sock, base: base}
	t.Cleanup(func() {
		srv.Monitor().CloseSubscribers()
		hs.Close()
		sbs, _ := e.ListSandboxes(context.Background())
		for _, s := range sbs {
			e.RemoveSandbox(context.Background(), s.Sandbox.Name)
		}
		e.Close()
	})
	return f
}

// httpClient talks raw HTTP to the fixture's socket.
func (f *fixture) httpClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return net.Dial("unix", f.sock) }}}
}

func (f *fixture) create(t testing.TB, name string) string {
	t.Helper()
	r, err := f.c.CreateSandbox(context.Background(), api.CreateRequest{Name: name, Base: f.base})
	if err != nil {
		t.Fatal(err)
	}
	return r.Root
}
