package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// mcpNodeModules is the node_modules holding the official MCP TypeScript
// SDK that scripts/deps.d/65-mcp-node.sh installs into the cache.
func mcpNodeModules(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		testenv.Missing(t, "node", "apt package nodejs")
	}
	cache := os.Getenv("TURNSNAP_CACHE")
	if cache == "" {
		cache = "/var/cache/turnsnap"
	}
	nm := filepath.Join(cache, "mcp-node", "current", "node_modules")
	if _, err := os.Stat(filepath.Join(nm, "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		testenv.Missing(t, "the MCP TypeScript SDK", "scripts/deps.d/65-mcp-node.sh installs it")
	}
	return nm
}

type mcpSummary struct {
	Server     struct{ Name, Version string }
	Tools      []string
	Checkpoint string
	Branch     string
	Error      string
}

// runMCPClient runs testdata/mcp_client.mjs (the TypeScript SDK's client,
// which calls every tool and checks its effect on the sandbox's files)
// with cfg, and returns its summary.
func runMCPClient(t *testing.T, cfg map[string]any) mcpSummary {
	t.Helper()
	nm := mcpNodeModules(t)
	// Node resolves the SDK from a node_modules beside the script.
	dir := t.TempDir()
	src, err := os.ReadFile(filepath.Join("testdata", "mcp_client.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "mcp_client.mjs")
	os.WriteFile(script, src, 0o644)
	if err := os.Symlink(nm, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script)
	cmd.Env = append(os.Environ(), "MCP_CONFIG="+string(data))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("the TypeScript MCP client failed: %v\nstdout: %s\nstderr: %s", err, out.String(), errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var s mcpSummary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &s); err != nil {
		t.Fatalf("client summary %q: %v", out.String(), err)
	}
	return s
}

// mcpSandbox creates sandbox name on home from a small base and returns
// its root.
func mcpSandbox(t *testing.T, home, name string) string {
	t.Helper()
	base := t.TempDir()
	os.MkdirAll(filepath.Join(base, "src"), 0o755)
	os.WriteFile(filepath.Join(base, "src", "main.go"), []byte("package main\n"), 0o644)
	out, _ := mustCLI(t, home, "sandbox", "create", name, "--base", base, "--json")
	var created struct{ Root string }
	if err := json.Unmarshal([]byte(out), &created); err != nil || created.Root == "" {
		t.Fatalf("sandbox create %s: %q: %v", name, out, err)
	}
	return created.Root
}

// checkMCPEffects checks, with the CLI, what the client's calls left:
// its checkpoint is the sandbox's head, and the branch is a sandbox whose
// files are that checkpoint's.
func checkMCPEffects(t *testing.T, home, sandbox string, s mcpSummary) {
	t.Helper()
	wantTools := []string{"branch", "cat", "checkpoint", "diff", "log", "restore_paths", "rollback"}
	if !slices.Equal(s.Tools, wantTools) || s.Server.Name != "turnsnap" || !strings.HasPrefix(s.Error, "not_found: ") {
		t.Fatalf("client summary: %+v", s)
	}
	out, _ := mustCLI(t, home, "log", sandbox, "--json")
	var log []struct {
		ID      string
		Head    bool
		Message string
	}
	json.Unmarshal([]byte(out), &log)
	if len(log) == 0 || log[0].ID != s.Checkpoint || !log[0].Head || log[0].Message != "feature works" {
		t.Fatalf("log %s after the client: %s; want its checkpoint %s at the head", sandbox, out, s.Checkpoint)
	}
	out, _ = mustCLI(t, home, "sandbox", "path", s.Branch, "--json")
	var p struct{ Root string }
	json.Unmarshal([]byte(out), &p)
	if b, err := os.ReadFile(filepath.Join(p.Root, "src", "feature.go")); err != nil || string(b) != "feature v1\n" {
		t.Fatalf("branch %s (root %q): feature.go %q, %v", s.Branch, p.Root, b, err)
	}
	if b, err := os.ReadFile(filepath.Join(p.Root, "src", "main.go")); err != nil || string(b) != "package main\n" {
		t.Fatalf("branch %s: main.go %q, %v", s.Branch, b, err)
	}
}

// `turnsnap mcp` over stdio, with no daemon: the TypeScript SDK's client
// lists and calls every tool (each call opens the home for itself), and
// the CLI sees what the calls did.
func TestMCPStdioTypeScriptClient(t *testing.T) {
	testenv.RequireRoot(t)
	home := filepath.Join(t.TempDir(), "home")
	root := mcpSandbox(t, home, "agent")
	t.Cleanup(func() {
		for _, n := range []string{"agent", "agent-try"} {
			cliRun(t, home, "sandbox", "rm", n)
		}
	})
	env := map[string]string{}
	for _, kv := range append(os.Environ(), runMainEnv+"=1") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	s := runMCPClient(t, map[string]any{"transport": "stdio", "command": os.Args[0],
		"args": []string{"--home", home, "mcp", "--sandbox", "agent"}, "env": env,
		"sandbox": "agent", "root": root, "branch": "agent-try"})
	checkMCPEffects(t, home, "agent", s)
}

// The daemon's streamable HTTP endpoint, on its TCP listener: the client
// is refused without the bearer token, then lists and calls every tool
// with it. `turnsnap mcp` over stdio then works through the same daemon
// (no tool call opens the home it serves).
func TestMCPDaemonTypeScriptClient(t *testing.T) {
	testenv.RequireRoot(t)
	mcpNodeModules(t) // before the daemon starts
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	tokenFile := filepath.Join(dir, "token")
	token := "mcp-token-0123456789abcdef"
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)
	d := startDaemon(t, home, nil, "--listen", "127.0.0.1:0", "--token-file", tokenFile)
	addr := tcpAddr(t, d)
	t.Cleanup(func() {
		for _, n := range []string{"agent", "agent-try", "agent2", "agent2-try"} {
			cliRun(t, home, "sandbox", "rm", n)
		}
	})

	root := mcpSandbox(t, home, "agent")
	s := runMCPClient(t, map[string]any{"transport": "http", "url": "http://" + addr + "/v1/sandboxes/agent/mcp",
		"token": token, "sandbox": "agent", "root": root, "branch": "agent-try"})
	checkMCPEffects(t, home, "agent", s)

	root2 := mcpSandbox(t, home, "agent2")
	env := map[string]string{}
	for _, kv := range append(os.Environ(), runMainEnv+"=1") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	s = runMCPClient(t, map[string]any{"transport": "stdio", "command": os.Args[0],
		"args": []string{"--home", home, "mcp", "--sandbox", "agent2"}, "env": env,
		"sandbox": "agent2", "root": root2, "branch": "agent2-try"})
	checkMCPEffects(t, home, "agent2", s)
	if strings.Contains(d.stderr.String(), "level=ERROR") {
		t.Errorf("the daemon logged errors:\n%s", d.stderr.String())
	}
}

// A `turnsnap mcp` session without a daemon does not hold the home
// between tool calls: while the session stays open, a CLI command that
// will not wait for the home's lock runs, and the session's next call
// sees its checkpoint.
func TestMCPStdioDoesNotHoldHome(t *testing.T) {
	testenv.RequireRoot(t)
	home := filepath.Join(t.TempDir(), "home")
	root := mcpSandbox(t, home, "agent")
	t.Cleanup(func() { cliRun(t, home, "sandbox", "rm", "agent") })
	ctx := context.Background()
	cmd := cli(home, nil, "mcp", "--sandbox", "agent")
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil).Connect(ctx,
		&mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	callOK := func(name string, args map[string]any) map[string]any {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil || res.IsError {
			t.Fatalf("%s: %v %+v\n%s", name, err, res, stderr.String())
		}
		out, _ := res.StructuredContent.(map[string]any)
		return out
	}
	os.WriteFile(filepath.Join(root, "a.txt"), []byte("a\n"), 0o644)
	callOK("checkpoint", map[string]any{"message": "from mcp"})
	os.WriteFile(filepath.Join(root, "b.txt"), []byte("b\n"), 0o644)
	out, errs := mustCLI(t, home, "--lock-wait", "0s", "checkpoint", "agent", "-m", "from the CLI", "--json")
	var cp struct{ ID string }
	if err := json.Unmarshal([]byte(out), &cp); err != nil || cp.ID == "" {
		t.Fatalf("checkpoint beside the session: %q %q", out, errs)
	}
	log := callOK("log", nil)
	first, _ := log["checkpoints"].([]any)
	if len(first) < 2 || first[0].(map[string]any)["id"] != cp.ID || first[1].(map[string]any)["message"] != "from mcp" {
		t.Fatalf("the session's log after the CLI's checkpoint %s: %v", cp.ID, log)
	}
}

// mcpIsolated checks the MCP endpoint at path (another tenant's sandbox
// name, with this tenant's token): GET and DELETE have nothing (405), and
// every tool, called with the other tenant's checkpoint, is a not_found
// tool error carrying none of secrets.
func mcpIsolated(t *testing.T, addr, token, method, path, otherID string, secrets ...string) {
	t.Helper()
	if method != http.MethodPost {
		if code, resp := rawCall(t, addr, token, method, path, ""); code != http.StatusMethodNotAllowed {
			t.Errorf("%s %s: HTTP %d %s, want 405", method, path, code, resp)
		}
		return
	}
	for i, c := range []struct {
		tool string
		args map[string]any
	}{
		{"log", nil},
		{"diff", map[string]any{"from": otherID, "patch": true}},
		{"cat", map[string]any{"checkpoint": otherID, "path": "/secret.txt"}},
		{"restore_paths", map[string]any{"checkpoint": otherID, "paths": []string{"/secret.txt"}}},
		{"rollback", map[string]any{"checkpoint": otherID}},
		{"checkpoint", map[string]any{"message": "stolen"}},
		{"branch", map[string]any{"name": "stolen", "checkpoint": otherID}},
		{"branch", map[string]any{"name": "stolen"}},
	} {
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
			"params": map[string]any{"name": c.tool, "arguments": c.args}})
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("POST %s %s: %v", path, c.tool, err)
		}
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		// The answer is JSON, or one server-sent event holding it.
		msg := string(raw)
		for _, line := range strings.Split(msg, "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				msg = d
			}
		}
		var rpc struct {
			Result struct {
				IsError bool `json:"isError"`
				Content []struct{ Text string }
			}
		}
		json.Unmarshal([]byte(msg), &rpc)
		if resp.StatusCode != http.StatusOK || !rpc.Result.IsError || len(rpc.Result.Content) == 0 ||
			!strings.HasPrefix(rpc.Result.Content[0].Text, "not_found: ") {
			t.Errorf("%s tool %s %v: HTTP %d %s, want a not_found tool error", path, c.tool, c.args, resp.StatusCode, raw)
		}
		if leak := containsAny(string(raw), secrets...); leak != "" {
			t.Errorf("%s tool %s answered with %q: %s", path, c.tool, leak, raw)
		}
	}
}
