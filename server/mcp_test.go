package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/turnsnap/turnsnap/api"
)

// The MCP endpoint on the server's mux (server.Options.MCP, mounted by the
// fixture as the daemon mounts it): the Go SDK's streamable HTTP client
// over the unix socket checkpoints a real sandbox and reads the record
// back through the API; a name that is no sandbox name is the API's 400
// problem, before MCP; GET has no stream on the stateless endpoint (405,
// not the catch-all's 404).
func TestAPIMCPEndpoint(t *testing.T) {
	f := serve(t, nil)
	root := f.create(t, "s")
	hc := f.httpClient()
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: "http://turnsnap/v1/sandboxes/s/mcp", HTTPClient: hc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	os.WriteFile(filepath.Join(root, "turn1.txt"), []byte("one\n"), 0o644)
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "checkpoint", Arguments: map[string]any{"message": "via mcp"}})
	if err != nil || res.IsError {
		t.Fatalf("checkpoint over HTTP: %v %+v", err, res)
	}
	var cp struct{ ID, Class string }
	b, _ := json.Marshal(res.StructuredContent)
	json.Unmarshal(b, &cp)
	log, err := f.c.Log(ctx, "s")
	if err != nil || len(log) == 0 || log[0].ID.String() != cp.ID || log[0].Message != "via mcp" || cp.Class != "fs" {
		t.Fatalf("log after the MCP checkpoint %+v: %+v, %v", cp, log, err)
	}
	// An unknown sandbox is a tool error naming the class.
	cs2, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: "http://turnsnap/v1/sandboxes/nosuch/mcp", HTTPClient: hc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs2.Close()
	res, err = cs2.CallTool(ctx, &mcp.CallToolParams{Name: "log"})
	if err != nil || !res.IsError || !strings.HasPrefix(res.Content[0].(*mcp.TextContent).Text, "not_found: ") {
		t.Fatalf("log of an unknown sandbox: %v %+v", err, res)
	}

	resp, err := hc.Post("http://turnsnap/v1/sandboxes/..bad/mcp", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	var p api.Problem
	json.NewDecoder(resp.Body).Decode(&p)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || p.Class != "invalid" {
		t.Fatalf("POST to a bad sandbox name: %d %+v", resp.StatusCode, p)
	}
	resp, err = hc.Get("http://turnsnap/v1/sandboxes/s/mcp")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET of the stateless endpoint: %d, want 405", resp.StatusCode)
	}
}
