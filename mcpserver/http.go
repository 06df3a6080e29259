package mcpserver

import (
	"log/slog"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/turnsnap/turnsnap/delta"
)

// Handler serves the tools over MCP's streamable HTTP transport, for the
// sandbox named by the request's {name} path value (the daemon mounts it
// at /v1/sandboxes/{name}/mcp; authentication is the daemon's, as for
// every route). It is stateless: each request gets a server of its own
// (cheap: the schemas are cached), so the daemon keeps no MCP session
// state to bound or lose, and an agent's session survives a daemon
// restart. The tools need no server-to-client requests, which is all a
// session would add.
func Handler(svc Service, opts Options) http.Handler {
	if opts.SchemaCache == nil {
		opts.SchemaCache = mcp.NewSchemaCache()
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		name := r.PathValue("name")
		if !delta.ValidRefName(name) {
			return nil // 400
		}
		return New(svc, name, opts)
	}, &mcp.StreamableHTTPOptions{Stateless: true, Logger: log})
}
