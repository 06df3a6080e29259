package main

import (
	"context"
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/client"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// A tenant whose home is encrypted with another key than the file's stops
// the start with the key's exit code, after the tenants before it were
// opened: their homes are released (a command on them does not wait for a
// lock). With the right key the daemon serves both over TLS, a fresh home
// is encrypted with its tenant's key at start, each token sees its own
// tenant, and SIGTERM exits 0 and removes every socket.
func TestTenantsStartAndStop(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	fx := newTenants(t, dir, "alpha", "bravo")
	k1, k2 := filepath.Join(dir, "k1.key"), filepath.Join(dir, "k2.key")
	mustCLI(t, filepath.Join(dir, "keyhome"), "key", "generate", k1)
	mustCLI(t, filepath.Join(dir, "keyhome"), "key", "generate", k2)
	mustCLI(t, fx.specs[1].Home, "init", "--key-file", k1)
	fx.specs[0].KeyFile, fx.specs[1].KeyFile = k2, k2
	fx.write(t)
	_, errs, code := cliRun(t, filepath.Join(dir, "unused"), "serve", "--tenants", fx.file, "--listen", "127.0.0.1:0")
	if code != exitKey || !strings.Contains(errs, "bravo") {
		t.Fatalf("a wrong key for bravo: exit %d %q, want exit %d naming the tenant", code, errs, exitKey)
	}
	if _, errs, code := cliRun(t, fx.specs[0].Home, "--lock-wait", "0", "status"); code != 0 {
		t.Fatalf("alpha's home after the refused start: exit %d %s", code, errs)
	}

	fx.specs[1].KeyFile = k1
	fx.write(t)
	certFile, keyFile, pool := selfSigned(t, dir)
	d := startDaemon(t, fx.specs[0].Home, nil, "--tenants", fx.file, "--listen", "127.0.0.1:0",
		"--tls-cert", certFile, "--tls-key", keyFile)
	re := regexp.MustCompile(`"serving TCP" addr=(127\.0\.0\.1:\d+) tls=true tenants=2`)
	var addr string
	for deadline := time.Now().Add(10 * time.Second); addr == ""; time.Sleep(10 * time.Millisecond) {
		if m := re.FindStringSubmatch(d.stderr.String()); m != nil {
			addr = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no TLS address in the log:\n%s", d.stderr.String())
		}
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	ctx := context.Background()
	for i, s := range fx.specs {
		c, err := client.New(client.Options{URL: "https://" + addr, Token: fx.tokens[i], HTTPClient: hc})
		if err != nil {
			t.Fatal(err)
		}
		st, err := c.Status(ctx)
		if err != nil {
			t.Fatalf("tenant %s over TLS: %v", s.Name, err)
		}
		if len(st.Sandboxes) != 0 {
			t.Errorf("tenant %s: %+v", s.Name, st)
		}
		// /healthz names the home the token reached.
		req, _ := http.NewRequest("GET", "https://"+addr+"/healthz", nil)
		req.Header.Set("Authorization", "Bearer "+fx.tokens[i])
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body strings.Builder
		buf := make([]byte, 4096)
		n, _ := resp.Body.Read(buf)
		body.Write(buf[:n])
		resp.Body.Close()
		if !strings.Contains(body.String(), s.Home) {
			t.Errorf("tenant %s's token reached %s", s.Name, body.String())
		}
	}
	// alpha's fresh home was encrypted with its tenant's key at start.
	cfg, err := os.ReadFile(filepath.Join(fx.specs[0].Home, "config.json"))
	if err != nil || !strings.Contains(string(cfg), k2) {
		t.Errorf("alpha's config after start: %s (%v), want its key file %s", cfg, err, k2)
	}
	if code := d.stop(t); code != 0 {
		t.Fatalf("SIGTERM: exit %d\n%s", code, d.stderr.String())
	}
	for _, s := range fx.specs {
		if _, err := os.Stat(filepath.Join(s.Home, socketName)); err == nil {
			t.Errorf("tenant %s's socket outlived the daemon", s.Name)
		}
	}
}
