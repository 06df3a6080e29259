package mcpserver_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/mcpserver"
	"github.com/turnsnap/turnsnap/server"
)

// These tests drive the tools with the Go SDK's own client over in-memory
// transports, on a real engine with real overlay sandboxes (root). The
// TypeScript SDK's client drives the same tools over stdio and the
// daemon's HTTP endpoint in cmd/turnsnap (mcp_test.go).

type fixture struct {
	svc  *server.Service
	base string
	root string // the sandbox "agent"'s root
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	testenv.RequireRoot(t)
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	e, err := engine.Open(context.Background(), engine.Options{Home: filepath.Join(dir, "home"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{svc: &server.Service{E: e}, base: filepath.Join(dir, "base")}
	t.Cleanup(func() {
		sbs, _ := e.ListSandboxes(context.Background())
		for _, s := range sbs {
			e.RemoveSandbox(context.Background(), s.Sandbox.Name)
		}
		e.Close()
	})
	os.MkdirAll(filepath.Join(f.base, "src"), 0o755)
	os.WriteFile(filepath.Join(f.base, "src", "main.go"), []byte("package main\n"), 0o644)
	c, err := f.svc.CreateSandbox(context.Background(), api.CreateRequest{Name: "agent", Base: f.base})
	if err != nil {
		t.Fatal(err)
	}
	f.root = c.Root
	return f
}

// session connects a Go SDK client to the tools of sandbox name.
func (f *fixture) session(t *testing.T, name string) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := mcpserver.New(f.svc, name, mcpserver.Options{}).Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close(); ss.Wait() })
	return cs
}

// call calls a tool that must succeed and decodes its structured result.
func call[T any](t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) T {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s %v: protocol error: %v", tool, args, err)
	}
	if res.IsError {
		t.Fatalf("%s %v: tool error: %s", tool, args, text(res))
	}
	var out T
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s: structured content %s: %v", tool, b, err)
	}
	return out
}

// callErr calls a tool that must fail as a tool error (not a protocol
// error) and returns its text.
func callErr(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) string {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s %v: a protocol error, want a tool error: %v", tool, args, err)
	}
	if !res.IsError {
		t.Fatalf("%s %v: succeeded, want a tool error: %s", tool, args, text(res))
	}
	return text(res)
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// Every tool is listed with an object input schema naming its required
// arguments, and the whole set is exactly the seven tools.
func TestMCPToolsListed(t *testing.T) {
	f := newFixture(t)
	cs := f.session(t, "agent")
	want := map[string][]string{
		"checkpoint": nil, "log": nil, "diff": nil, "cat": {"checkpoint", "path"},
		"restore_paths": {"checkpoint", "paths"}, "rollback": {"checkpoint"}, "branch": {"name"},
	}
	var got []string
	for tool, err := range cs.Tools(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, tool.Name)
		b, _ := json.Marshal(tool.InputSchema)
		var schema struct {
			Type     string   `json:"type"`
			Required []string `json:"required"`
		}
		json.Unmarshal(b, &schema)
		slices.Sort(schema.Required)
		if schema.Type != "object" || !slices.Equal(schema.Required, want[tool.Name]) {
			t.Errorf("tool %s: input schema %s, want an object requiring %v", tool.Name, b, want[tool.Name])
		}
		if tool.OutputSchema == nil || tool.Description == "" {
			t.Errorf("tool %s has no output schema or description", tool.Name)
		}
	}
	slices.Sort(got)
	if len(got) != len(want) {
		t.Fatalf("tools %v, want the %d of %v", got, len(want), want)
	}
}

// Failures come back as tool errors whose text starts with the errdefs
// class, never as protocol failures: an unknown sandbox, references that
// name no checkpoint, an existing branch name, arguments the schema
// refuses.
func TestMCPToolErrors(t *testing.T) {
	f := newFixture(t)
	cs := f.session(t, "agent")
	cp := call[mcpserver.Checkpoint](t, cs, "checkpoint", map[string]any{"message": "one"})

	nosuch := f.session(t, "nosuch")
	for _, tc := range []struct {
		cs    *mcp.ClientSession
		tool  string
		args  map[string]any
		class string
	}{
		{nosuch, "checkpoint", nil, "not_found:"},
		{nosuch, "log", nil, "not_found:"},
		{nosuch, "diff", nil, "not_found:"},
		{nosuch, "rollback", map[string]any{"checkpoint": cp.ID}, "not_found:"},
		{nosuch, "restore_paths", map[string]any{"checkpoint": cp.ID, "paths": []string{"/src"}}, "not_found:"},
		{nosuch, "branch", map[string]any{"name": "b"}, "not_found:"},
		{cs, "cat", map[string]any{"checkpoint": "0000000000000000", "path": "/src/main.go"}, "not_found:"},
		{cs, "cat", map[string]any{"checkpoint": cp.ID, "path": "/src/nosuch"}, "not_found:"},
		{cs, "rollback", map[string]any{"checkpoint": "0000000000000000"}, "not_found:"},
		{cs, "diff", map[string]any{"from": "no-such-tag"}, "not_found:"},
		{cs, "restore_paths", map[string]any{"checkpoint": "0000000000000000", "paths": []string{"/src"}}, "not_found:"},
		{cs, "branch", map[string]any{"name": "agent", "checkpoint": cp.ID}, "exists:"},
		{cs, "branch", map[string]any{"name": "b", "count": 100000}, "invalid:"},
		{cs, "cat", map[string]any{"checkpoint": cp.ID, "path": "/src/main.go", "max_bytes": -1}, "invalid:"},
		{cs, "log", map[string]any{"limit": -3}, "invalid:"},
		{cs, "restore_paths", map[string]any{"checkpoint": cp.ID, "paths": []string{}}, "invalid:"},
		// The SDK validates arguments against the schema first; its
		// refusal is a tool error too.
		{cs, "rollback", map[string]any{}, "validating"},
		{cs, "cat", map[string]any{"checkpoint": cp.ID, "path": "/x", "bogus": 1}, "validating"},
	} {
		msg := callErr(t, tc.cs, tc.tool, tc.args)
		if !strings.HasPrefix(msg, tc.class) {
			t.Errorf("%s %v: %q, want it to start with %q", tc.tool, tc.args, msg, tc.class)
		}
	}
	// The refusals changed nothing: one checkpoint, one sandbox besides none.
	if l := call[mcpserver.LogOutput](t, cs, "log", nil); len(l.Checkpoints) == 0 || l.Checkpoints[0].ID != cp.ID {
		t.Fatalf("log after the errors: %+v, want head %s", l, cp.ID)
	}
}

// The tools' effects, quickly: checkpoint, a change diff sees, cat of the
// old bytes, restore_paths of one file, rollback of everything, branch
// from the head, log marking the head.
func TestMCPToolsEffects(t *testing.T) {
	f := newFixture(t)
	cs := f.session(t, "agent")
	main := filepath.Join(f.root, "src", "main.go")
	cp1 := call[mcpserver.Checkpoint](t, cs, "checkpoint", map[string]any{"message": "good", "turn": 7})
	if cp1.Turn != 7 || cp1.ID == "" {
		t.Fatalf("checkpoint: %+v", cp1)
	}
	if skip := call[mcpserver.Checkpoint](t, cs, "checkpoint", nil); skip.Class != "skip" || skip.ID != cp1.ID {
		t.Fatalf("a checkpoint of no change: %+v, want skip at %s", skip, cp1.ID)
	}
	os.WriteFile(main, []byte("package main // broken\n"), 0o644)
	os.WriteFile(filepath.Join(f.root, "src", "new.go"), []byte("package main\n"), 0o644)
	d := call[mcpserver.DiffOutput](t, cs, "diff", map[string]any{"patch": true})
	var paths []string
	for _, c := range d.Changes {
		paths = append(paths, c.Change+" "+c.Path)
	}
	slices.Sort(paths)
	if !slices.Equal(paths, []string{"added /src/new.go", "modified /src/main.go"}) {
		t.Fatalf("diff: %v", paths)
	}
	cat := call[mcpserver.CatOutput](t, cs, "cat", map[string]any{"checkpoint": cp1.ID, "path": "/src/main.go"})
	if cat.Text != "package main\n" || cat.Truncated {
		t.Fatalf("cat: %+v", cat)
	}
	if short := call[mcpserver.CatOutput](t, cs, "cat", map[string]any{"checkpoint": cp1.ID, "path": "/src/main.go", "max_bytes": 4}); short.Text != "pack" || !short.Truncated {
		t.Fatalf("cat max_bytes 4: %+v", short)
	}
	rp := call[mcpserver.RestorePathsOutput](t, cs, "restore_paths", map[string]any{"checkpoint": cp1.ID, "paths": []string{"/src/main.go"}})
	if b, _ := os.ReadFile(main); string(b) != "package main\n" || len(rp.Paths) != 1 || rp.Paths[0].Action != "restored" {
		t.Fatalf("restore_paths: %+v, main.go %q", rp, b)
	}
	if _, err := os.Stat(filepath.Join(f.root, "src", "new.go")); err != nil {
		t.Fatalf("restore_paths touched another path: %v", err)
	}
	cp2 := call[mcpserver.Checkpoint](t, cs, "checkpoint", map[string]any{"message": "with new.go"})
	rb := call[mcpserver.Restored](t, cs, "rollback", map[string]any{"checkpoint": cp1.ID})
	if _, err := os.Stat(filepath.Join(f.root, "src", "new.go")); !os.IsNotExist(err) || rb.Checkpoint != cp1.ID {
		t.Fatalf("rollback to %s: %+v, new.go: %v", cp1.ID, rb, err)
	}
	l := call[mcpserver.LogOutput](t, cs, "log", nil)
	if len(l.Checkpoints) == 0 {
		t.Fatal("log is empty")
	}
	for _, c := range l.Checkpoints {
		if c.Head != (c.ID == cp1.ID) {
			t.Errorf("log: %s head=%v; the head is %s (cp2 %s)", c.ID, c.Head, cp1.ID, cp2.ID)
		}
	}
	br := call[mcpserver.BranchOutput](t, cs, "branch", map[string]any{"name": "try"})
	if len(br.Sandboxes) != 1 || br.Sandboxes[0].Sandbox != "try" || br.Sandboxes[0].Checkpoint != cp1.ID {
		t.Fatalf("branch from the head: %+v", br)
	}
}
