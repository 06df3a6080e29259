package api

// LLMUpstreamRequest is PATCH /v1/sandboxes/{name}.
type LLMUpstreamRequest struct {
	// LLMUpstream is the sandbox's own upstream base URL; "" clears it.
	LLMUpstream *string `json:"llm_upstream,omitempty"`
	// LLMReplay is when the sandbox's journal may answer its model calls:
	// "auto" (only a re-run after a restore; "" too) or "off" (never).
	LLMReplay *string `json:"llm_replay,omitempty"`
}

// LLMSandbox is one sandbox's LLM route.
type LLMSandbox struct {
	Name     string `json:"name"`
	Upstream string `json:"upstream,omitempty"` // redacted; "" means the default
	Route    string `json:"route,omitempty"`    // when the proxy runs
	Replay   string `json:"replay,omitempty"`   // "off" when set; "" is auto
}

// LLMStatus is GET /v1/llm.
type LLMStatus struct {
	Proxy       bool         `json:"proxy"` // the daemon serves the proxy
	URL         string       `json:"url,omitempty"`
	Gate        string       `json:"gate,omitempty"`
	Default     string       `json:"default_upstream,omitempty"` // redacted
	Sandboxes   []LLMSandbox `json:"sandboxes"`
	GateTimeout float64      `json:"gate_timeout_s,omitempty"`
}
