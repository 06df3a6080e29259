package client

import (
	"context"
	"net/http"

	"github.com/turnsnap/turnsnap/api"
)

// SetLLMUpstream sets (or with "" clears) a sandbox's own LLM upstream.
func (c *Client) SetLLMUpstream(ctx context.Context, name string, req api.LLMUpstreamRequest) (*api.LLMSandbox, error) {
	return call[api.LLMSandbox](ctx, c, http.MethodPatch, "/v1/sandboxes/"+esc(name), req)
}

// LLMStatus is the daemon's LLM proxy and the sandboxes' upstreams.
func (c *Client) LLMStatus(ctx context.Context) (*api.LLMStatus, error) {
	return call[api.LLMStatus](ctx, c, http.MethodGet, "/v1/llm", nil)
}
