package server

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// A sandbox's route refuses every path but its own sandbox's proxy
// routes, before the proxy sees them.
func TestAgentRouteRefusesOtherSandboxes(t *testing.T) {
	h := (&LLM{}).agentHandler("a1")
	for _, p := range []string{"/llm/a2/v1/messages", "/llm/a1", "/llm/a1%2F..%2Fa2/v1/models", "/llm/a10/v1/messages", "/v1/sandboxes", "/v1/sandboxes/a2/mcp", "/"} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, p, nil))
		if w.Code != http.StatusForbidden {
			t.Errorf("%s: status %d, want 403", p, w.Code)
		}
	}
}
