package main

import (
	"io"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/testenv"
)

// The listener rules: a non-loopback TCP address without TLS and TCP
// without a token are refused before the home is opened; the socket is 0600
// (0660 with --socket-group, owned by that group); over TCP a request
// without the bearer token, or with another, gets 401, and the CLI reaches
// the daemon with --daemon and --daemon-token-file.
func TestServeListenerRules(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	tokenFile := filepath.Join(dir, "token")
	token := "s3cret-token-0123456789abcdef"
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:0", "--token-file", tokenFile}, "without TLS"},
		{[]string{"--listen", ":7777", "--token-file", tokenFile}, "without TLS"},
		{[]string{"--listen", "127.0.0.1:0"}, "--token-file"},
		{[]string{"--listen", "127.0.0.1:0", "--token-file", tokenFile, "--tls-cert", "c.pem"}, "go together"},
		{[]string{"--log-format", "xml"}, "log-format"},
	} {
		_, errs, code := cliRun(t, home, append([]string{"serve"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(errs, tc.want) {
			t.Errorf("serve %v: exit %d, %q; want exit 2 naming %q", tc.args, code, errs, tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(home, socketName)); err == nil {
		t.Fatal("a refused serve left a socket")
	}

	d := startDaemon(t, home, nil)
	sockMode(t, home, 0o600, 0)
	d.stop(t)

	g, err := user.LookupGroupId("1")
	if err != nil {
		t.Skipf("no group 1 on this host: %v", err)
	}
	d = startDaemon(t, home, nil, "--socket-group", g.Name, "--listen", "127.0.0.1:0", "--token-file", tokenFile)
	sockMode(t, home, 0o660, 1)
	var addr string
	deadline := time.Now().Add(10 * time.Second)
	re := regexp.MustCompile(`"serving TCP" addr=(127\.0\.0\.1:\d+)`)
	for addr == "" {
		if m := re.FindStringSubmatch(d.stderr.String()); m != nil {
			addr = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no TCP address in the log:\n%s", d.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, auth := range []string{"", "Bearer wrong-token-0123456789abcdef", "Bearer " + token + "x", "Basic " + token, token} {
		req, _ := http.NewRequest("GET", "http://"+addr+"/v1/sandboxes", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("Authorization %q: HTTP %d %s %s, want 401 problem+json", auth, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	}
	for _, p := range []string{"/healthz", "/metrics", "/v1/status"} {
		req, _ := http.NewRequest("GET", "http://"+addr+p, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s with the token: HTTP %d", p, resp.StatusCode)
		}
	}
	// The CLI over TCP. --home points elsewhere: the request goes to the
	// daemon, not to any home of this process.
	other := filepath.Join(dir, "unused-home")
	out, errs, code := cliRun(t, other, "--daemon", "http://"+addr, "--daemon-token-file", tokenFile, "status", "--json")
	if code != 0 || !strings.Contains(out, "objects_pending") {
		t.Fatalf("status over TCP: exit %d %s %s", code, out, errs)
	}
	if _, err := os.Stat(other); err == nil {
		t.Fatal("a --daemon command opened its own home")
	}
	os.WriteFile(filepath.Join(dir, "bad"), []byte("nope-nope-nope-nope-nope\n"), 0o600)
	if _, _, code := cliRun(t, other, "--daemon", "http://"+addr, "--daemon-token-file", filepath.Join(dir, "bad"), "status"); code == 0 {
		t.Fatal("a wrong token was accepted by the CLI path")
	}
}

func sockMode(t *testing.T, home string, mode os.FileMode, gid uint32) {
	t.Helper()
	fi, err := os.Stat(filepath.Join(home, socketName))
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != mode || fi.Mode()&os.ModeSocket == 0 || st.Gid != gid {
		t.Fatalf("socket mode %v gid %d, want %v gid %s", fi.Mode(), st.Gid, mode, strconv.Itoa(int(gid)))
	}
}
