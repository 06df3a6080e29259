package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/client"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// One daemon, two tenants (alpha encrypted, bravo not) in one bucket under
// their own prefixes, over one TCP listener. With alpha's token every route
// of the API (from the server's route table, so a new route is walked
// too), pointed at bravo's sandbox, checkpoint ids, tags and paths,
// answers 404 or is refused (the MCP endpoint: every tool a not_found tool
// error); bravo's log, tags, sandboxes and files are
// unchanged afterwards; alpha's event stream never carries bravo's turns;
// and 1 MiB that both tenants hold is stored once per tenant.
func TestTenantsCannotReachEachOther(t *testing.T) {
	testenv.RequireRoot(t)
	srv := miniotest.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	dir := t.TempDir()
	fx := newTenants(t, dir, "alpha", "bravo")
	alpha, bravo := fx.specs[0], fx.specs[1]
	keyFile := filepath.Join(dir, "alpha.key")
	mustCLI(t, filepath.Join(dir, "keyhome"), "key", "generate", keyFile)
	fx.specs[0].KeyFile = keyFile
	for i, n := range []string{"alpha", "bravo"} {
		fx.specs[i].Remote = &engine.RemoteConfig{URL: "s3://tenants/" + n, Endpoint: srv.Endpoint, Insecure: true}
	}
	big := make([]byte, 1<<20)
	rand.Read(big)
	for _, s := range fx.specs {
		os.WriteFile(filepath.Join(s.Bases, "big"), big, 0o644)
		os.WriteFile(filepath.Join(s.Bases, "who"), []byte(s.Name+"\n"), 0o644)
	}
	fx.write(t)

	d := startDaemon(t, alpha.Home, nil, "--tenants", fx.file, "--listen", "127.0.0.1:0")
	addr := tcpAddr(t, d)
	ca := tcpClient(t, addr, fx.tokens[0])
	cb := tcpClient(t, addr, fx.tokens[1])
	ctx := context.Background()
	// Whatever sandboxes exist at the end (a failing run's too) are removed
	// before the daemon stops, so no mount outlives the test.
	t.Cleanup(func() {
		for _, c := range []*client.Client{ca, cb} {
			sbs, _ := c.ListSandboxes(context.Background())
			for _, sb := range sbs {
				c.RemoveSandbox(context.Background(), sb.Name, false)
			}
		}
	})

	// bravo: a sandbox with a secret, two turns, a tag.
	bsb, bsbTag := "bravo-secret-sb", "bravo-tag"
	bc, err := cb.CreateSandbox(ctx, api.CreateRequest{Name: bsb, Base: bravo.Bases})
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(bc.Root, "secret.txt"), []byte("bravo's secret\n"), 0o600)
	bcp, err := cb.Checkpoint(ctx, bsb, api.CheckpointRequest{Message: "bravo turn"})
	if err != nil {
		t.Fatal(err)
	}
	bID := bcp.ID.String()
	if _, err := cb.SetTag(ctx, bsbTag, api.TagRequest{Checkpoint: bID}); err != nil {
		t.Fatal(err)
	}

	// alpha: a sandbox of its own, subscribed to its own events.
	asb := "alpha-sb"
	ac, err := ca.CreateSandbox(ctx, api.CreateRequest{Name: asb, Base: alpha.Bases})
	if err != nil {
		t.Fatal(err)
	}
	var evs eventLog
	evCtx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	go ca.Events(evCtx, "", evs.add)
	turnA := func(content string) string {
		t.Helper()
		os.WriteFile(filepath.Join(ac.Root, "turn"), []byte(content), 0o644)
		cp, err := ca.Checkpoint(ctx, asb, api.CheckpointRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return cp.ID.String()
	}
	// Subscribed once one of alpha's turns shows up in the stream.
	deadline := time.Now().Add(30 * time.Second)
	for n := 0; ; n++ {
		id := turnA(fmt.Sprintf("turn %d\n", n))
		waitFor := time.Now().Add(2 * time.Second)
		for !evs.has(asb, id) && time.Now().Before(waitFor) {
			time.Sleep(10 * time.Millisecond)
		}
		if evs.has(asb, id) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("alpha's event stream never carried alpha's turn")
		}
	}
	// A bravo turn while alpha listens, then an alpha turn: a leaked bravo
	// event would be in alpha's stream before alpha's.
	os.WriteFile(filepath.Join(bc.Root, "secret2.txt"), []byte("more\n"), 0o600)
	b2, err := cb.Checkpoint(ctx, bsb, api.CheckpointRequest{WaitRemote: true})
	if err != nil {
		t.Fatal(err)
	}
	aLast := turnA("last\n")
	for !evs.has(asb, aLast) {
		if time.Now().After(deadline) {
			t.Fatal("alpha's last turn never reached its stream")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := ca.Sync(ctx, api.SyncRequest{}); err != nil {
		t.Fatal(err)
	}

	// Dedup does not cross tenants: the 1 MiB both bases hold is in each
	// tenant's prefix.
	for _, n := range []string{"alpha", "bravo"} {
		if got := dirBytes(filepath.Join(srv.Dir, "tenants", n)); got < 1<<20 {
			t.Errorf("tenant %s's prefix holds %d bytes, want the 1 MiB file stored for it too", n, got)
		}
	}

	bNames := []string{bsb, bsbTag, bID, bID[:12], b2.ID.String(), bravo.Home, "bravo's secret"}
	before := bState(t, cb, bsb, bc.Root)

	// Every route, with alpha's token, at bravo's things.
	params := map[string][]string{
		"{name}": {bsb},
		"{ref}":  {bID, bID[:12], bsbTag},
		"{tag}":  {bsbTag},
	}
	bodies := map[string]string{
		"POST /v1/sandboxes/{name}/checkpoints": `{"message":"stolen"}`,
		"POST /v1/sandboxes/{name}/exec":        `{"argv":["cat","/secret.txt"]}`,
		"POST /v1/sandboxes/{name}/rollback":    `{"checkpoint":"` + bID + `"}`,
		"POST /v1/checkpoints/{ref}/branches":   `{"name":"stolen"}`,
		"PUT /v1/tags/{tag}":                    `{"checkpoint":"` + bID + `"}`,
		"GET /v1/sandboxes/{name}/diff":         "?from=" + bID,
		"POST /v1/sandboxes":                    `{"name":"stolen","base":"` + bravo.Home + `"}`,
		"POST /v1/store/verify":                 `{"checkpoint":"` + bID + `"}`,
		"POST /v1/sync":                         `{"sandbox":"` + bsb + `"}`,
		"POST /v1/prune":                        `{"keep_last":1,"gc":true}`,
		"POST /v1/gc":                           `{"grace_ms":0}`,
		"POST /v1/init":                         `{"remote":{"url":"s3://tenants/bravo","endpoint":"` + srv.Endpoint + `","insecure":true}}`,
		"POST /v1/catalog/rebuild":              `{}`,
		"POST /v1/sandboxes/{name}/restore":     `{"checkpoint":"` + bID + `","paths":["/secret.txt"]}`,
		"GET /v1/checkpoints/{ref}/content":     "?path=/secret.txt",
		"GET /v1/checkpoints/{ref}/entries":     "?path=/",
		"PUT /v1/policies":                      `{"sandbox":"` + bsb + `","policy":{"keep_last":1}}`,
		"DELETE /v1/policies":                   "?sandbox=" + bsb,
		"POST /v1/forget":                       `{"sandbox":"` + bsb + `","policy":{"keep_last":1}}`,
	}
	// Routes that name nothing: they answer for alpha alone (checked
	// below) or are refused.
	global := map[string][]int{
		"POST /v1/sandboxes":       {http.StatusNotFound},
		"GET /v1/sandboxes":        {http.StatusOK},
		"POST /v1/store/verify":    {http.StatusNotFound},
		"GET /v1/tags":             {http.StatusOK},
		"GET /v1/status":           {http.StatusOK},
		"POST /v1/sync":            {http.StatusOK, http.StatusNotFound},
		"POST /v1/prune":           {http.StatusOK},
		"POST /v1/gc":              {http.StatusOK},
		"POST /v1/init":            {http.StatusPreconditionFailed},
		"POST /v1/catalog/rebuild": {http.StatusOK},
		"GET /healthz":             {http.StatusOK},
		"GET /metrics":             {http.StatusOK},
		"GET /v1/events":           nil, // a stream: the subscription above
		"GET /v1/llm":              {http.StatusOK},
		"GET /v1/lineage":          {http.StatusOK},
		"GET /v1/policies":         {http.StatusOK},
		"PUT /v1/policies":         {http.StatusNotFound},
		"DELETE /v1/policies":      {http.StatusNotFound},
		"POST /v1/forget":          {http.StatusNotFound},
		"POST /v1/policies/apply":  {http.StatusOK},
	}
	call := func(pattern, path string, want []int) {
		method, _, _ := strings.Cut(pattern, " ")
		body := bodies[pattern]
		if strings.HasPrefix(body, "?") {
			path, body = path+body, ""
		}
		code, resp := rawCall(t, addr, fx.tokens[0], method, path, body)
		ok := false
		for _, w := range want {
			ok = ok || code == w
		}
		if !ok {
			t.Errorf("alpha's %s %s: HTTP %d %s, want %v", method, path, code, resp, want)
		}
		if leak := containsAny(resp, bNames...); leak != "" && code == http.StatusOK {
			t.Errorf("alpha's %s %s answered with bravo's %q: %s", method, path, leak, resp)
		}
	}
	routes := serverRoutes(t)
	for _, pattern := range routes {
		_, path, _ := strings.Cut(pattern, " ")
		if !strings.Contains(path, "{") {
			want, known := global[pattern]
			if !known {
				t.Errorf("route %s is not in the tenant walk: say what another tenant's token may get from it", pattern)
			} else if want != nil {
				call(pattern, path, want)
			}
			continue
		}
		paths := []string{path}
		for p, values := range params {
			var next []string
			for _, pp := range paths {
				if !strings.Contains(pp, p) {
					next = append(next, pp)
					continue
				}
				for _, v := range values {
					next = append(next, strings.ReplaceAll(pp, p, v))
				}
			}
			paths = next
		}
		for _, p := range paths {
			if strings.HasSuffix(p, "/mcp") {
				// MCP speaks JSON-RPC: a tool error, not a 404 (mcp_test.go).
				method, _, _ := strings.Cut(pattern, " ")
				mcpIsolated(t, addr, fx.tokens[0], method, p, bID, "bravo's secret", bravo.Home, bc.Root)
				continue
			}
			call(pattern, p, []int{http.StatusNotFound})
		}
	}
	if len(routes) < 20 {
		t.Fatalf("only %d routes in the table: %v", len(routes), routes)
	}
	// bravo's things through alpha's own names, and host paths.
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/sandboxes/" + asb + "/rollback", `{"checkpoint":"` + bID + `"}`},
		{"POST", "/v1/sandboxes/" + asb + "/rollback", `{"checkpoint":"` + bsbTag + `"}`},
		{"GET", "/v1/sandboxes/" + asb + "/diff?from=" + bID, ""},
		{"PUT", "/v1/tags/mine", `{"checkpoint":"` + bID[:12] + `"}`},
		{"POST", "/v1/sandboxes", `{"name":"stolen","base":"` + bravo.Bases + `"}`},
		{"POST", "/v1/sandboxes", `{"name":"stolen","base":"` + bc.Root + `"}`},
		{"POST", "/v1/sandboxes", `{"name":"stolen","base":"/"}`},
		{"POST", "/v1/sandboxes", `{"name":"stolen","base":"` + alpha.Home + `"}`},
	} {
		if code, resp := rawCall(t, addr, fx.tokens[0], c.method, c.path, c.body); code != http.StatusNotFound {
			t.Errorf("alpha's %s %s %s: HTTP %d %s, want 404", c.method, c.path, c.body, code, resp)
		}
	}
	for _, body := range []string{`{"key_file":"` + keyFile + `"}`,
		`{"name":"p","base":"` + alpha.Bases + `","btrfs_pool":"/tmp"}`} {
		path := "/v1/init"
		if strings.Contains(body, "base") {
			path = "/v1/sandboxes"
		}
		if code, resp := rawCall(t, addr, fx.tokens[0], "POST", path, body); code != http.StatusPreconditionFailed {
			t.Errorf("alpha's POST %s %s: HTTP %d %s, want refused (412)", path, body, code, resp)
		}
	}

	if after := bState(t, cb, bsb, bc.Root); after != before {
		t.Errorf("bravo changed under alpha's token:\nbefore %s\nafter  %s", before, after)
	}
	for _, ref := range []string{bID, b2.ID.String()} {
		if _, err := cb.Verify(ctx, ref); err != nil {
			t.Errorf("bravo's checkpoint %s after alpha's walk: %v", ref, err)
		}
	}
	sbs, err := ca.ListSandboxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs) != 1 || sbs[0].Name != asb {
		t.Errorf("alpha's sandboxes after the walk: %+v, want only %s", sbs, asb)
	}
	// Branching into bravo's sandbox name makes a sandbox of alpha's own,
	// in alpha's home; bravo's is untouched.
	br, err := ca.Branch(ctx, aLast, api.BranchRequest{Name: bsb})
	if err != nil {
		t.Fatalf("alpha's branch named like bravo's sandbox: %v", err)
	}
	if br[0].Root == bc.Root || !strings.HasPrefix(br[0].Root, alpha.Home+"/") {
		t.Errorf("alpha's branch %s is at %s, bravo's sandbox at %s", bsb, br[0].Root, bc.Root)
	}
	if _, err := ca.RemoveSandbox(ctx, bsb, false); err != nil {
		t.Fatal(err)
	}
	if after := bState(t, cb, bsb, bc.Root); after != before {
		t.Errorf("bravo changed when alpha branched into its name:\nbefore %s\nafter  %s", before, after)
	}
	evs.mu.Lock()
	// alpha's own failed requests naming bravo's sandbox show up as
	// alpha's failures (not found); none of bravo's turns does. alpha's
	// own changes of state (its branch into bravo's sandbox name, that
	// sandbox's removal) are alpha's events.
	for _, ev := range evs.events {
		turn := ev.Type == api.EventCommitted || ev.Type == api.EventFailed || ev.Type == api.EventRemoteDurable
		if containsAny(ev.Checkpoint, bID, b2.ID.String()) != "" ||
			(turn && ev.Sandbox != asb && (ev.Type != api.EventFailed || ev.ErrorClass != "not_found")) {
			t.Errorf("alpha's event stream carried %+v", ev)
		}
	}
	evs.mu.Unlock()
	// The CLI over TCP acts for the tenant its token names.
	other := filepath.Join(dir, "cli-home")
	viaCLI := func(tenant int, args ...string) (string, int) {
		out, _, code := cliRun(t, other, append([]string{"--daemon", "http://" + addr, "--daemon-token-file", fx.specs[tenant].TokenFile}, args...)...)
		return out, code
	}
	if out, code := viaCLI(1, "sandbox", "list", "--json"); code != 0 || !strings.Contains(out, bsb) {
		t.Errorf("bravo's CLI lists: exit %d %s", code, out)
	}
	if out, code := viaCLI(0, "log", bsb); code != exitNotFound {
		t.Errorf("alpha's CLI on bravo's log: exit %d %s, want %d", code, out, exitNotFound)
	}
	if out, code := viaCLI(0, "sandbox", "list", "--json"); code != 0 || strings.Contains(out, bsb) {
		t.Errorf("alpha's CLI lists: exit %d %s", code, out)
	}
	// The host's own tools reach each tenant on its home's socket.
	bSock, err := client.New(client.Options{Socket: filepath.Join(bravo.Home, socketName)})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := bSock.ListSandboxes(ctx); err != nil || len(got) != 1 || got[0].Name != bsb {
		t.Errorf("bravo's socket lists %+v (%v), want %s", got, err, bsb)
	}
}

func tcpClient(t *testing.T, addr, token string) *client.Client {
	t.Helper()
	c, err := client.New(client.Options{URL: "http://" + addr, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
