package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/client"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/server"
	"github.com/turnsnap/turnsnap/server/tenants"
)

// tenantsFixture is a tenants file and the paths it names.
type tenantsFixture struct {
	dir, file string
	specs     []tenants.TenantSpec
	tokens    []string
}

// newTenants makes n tenants under dir: home, token, bases of their own.
func newTenants(t *testing.T, dir string, names ...string) *tenantsFixture {
	t.Helper()
	fx := &tenantsFixture{dir: dir, file: filepath.Join(dir, "tenants.json")}
	for _, n := range names {
		tok := "token-of-" + n + "-" + strings.Repeat("x", 16)
		tf := filepath.Join(dir, n+".token")
		if err := os.WriteFile(tf, []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		bases := filepath.Join(dir, "bases", n)
		os.MkdirAll(bases, 0o755)
		fx.specs = append(fx.specs, tenants.TenantSpec{Name: n, Home: filepath.Join(dir, "homes", n), TokenFile: tf, Bases: bases})
		fx.tokens = append(fx.tokens, tok)
	}
	return fx
}

func (fx *tenantsFixture) write(t *testing.T) {
	t.Helper()
	data, err := json.MarshalIndent(tenants.TenantsFile{Tenants: fx.specs}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fx.file, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// tcpAddr waits for the daemon's "serving TCP" line.
func tcpAddr(t *testing.T, d *daemonProc) string {
	t.Helper()
	re := regexp.MustCompile(`"serving TCP" addr=(127\.0\.0\.1:\d+)`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := re.FindStringSubmatch(d.stderr.String()); m != nil {
			return m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no TCP address in the log:\n%s", d.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rawCall is one HTTP request with a bearer token; it returns the status
// and body.
func rawCall(t *testing.T, addr, token, method, path, body string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// serverRoutes is the API's route table, from a server on a scratch home.
func serverRoutes(t *testing.T) []string {
	t.Helper()
	e, err := engine.Open(context.Background(), engine.Options{Home: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s, err := server.New(e, server.Options{MCP: mcpHandler(nil)})
	if err != nil {
		t.Fatal(err)
	}
	return s.Routes()
}

// treeOf reads every regular file under root (relative path -> content).
func treeOf(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			rel, _ := filepath.Rel(root, p)
			out[rel] = string(b)
		}
		return nil
	})
	return out
}

// dirBytes sums the sizes of the files under dir.
func dirBytes(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// bState is what tenant B has, as B's own token sees it.
func bState(t *testing.T, cb *client.Client, sandbox, root string) string {
	t.Helper()
	ctx := context.Background()
	sbs, err := cb.ListSandboxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	log, err := cb.Log(ctx, sandbox)
	if err != nil {
		t.Fatal(err)
	}
	tags, err := cb.Tags(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return mustJSON(t, sbs) + "\n" + mustJSON(t, log) + "\n" + mustJSON(t, tags) + "\n" + mustJSON(t, treeOf(t, root))
}

// onlyB are strings that name something of B's and must never reach A.
func containsAny(s string, subs ...string) string {
	for _, x := range subs {
		if x != "" && strings.Contains(s, x) {
			return x
		}
	}
	return ""
}

// eventLog collects a tenant's event stream.
type eventLog struct {
	mu     sync.Mutex
	events []api.Event
}

func (l *eventLog) add(ev api.Event) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, ev)
	return nil
}

func (l *eventLog) has(sandbox, checkpoint string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ev := range l.events {
		if ev.Sandbox == sandbox && ev.Checkpoint == checkpoint && ev.Type == api.EventCommitted {
			return true
		}
	}
	return false
}
