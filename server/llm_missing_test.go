package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/turnsnap/turnsnap/llmproxy"
	"github.com/turnsnap/turnsnap/server"
)

// TestLLMRouteToMissingSandbox: a model call routed to a sandbox the home
// does not have (never made, removed, or no valid name) is answered 404
// with a problem, and never reaches the upstream; the same call for a
// sandbox that exists is forwarded.
func TestLLMRouteToMissingSandbox(t *testing.T) {
	f := serve(t, nil)
	ctx := context.Background()
	f.create(t, "agent")
	f.create(t, "gone")
	if _, err := f.c.RemoveSandbox(ctx, "gone", false); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	proxy := llmBehind(t, f, func() { calls.Add(1) })
	post := func(sandbox string) (int, map[string]any) {
		t.Helper()
		resp, err := http.Post(proxy.URL+"/llm/"+sandbox+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"go"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body
	}
	for _, name := range []string{"never-made", "gone"} {
		code, body := post(name)
		if detail, _ := body["detail"].(string); code != http.StatusNotFound || !strings.Contains(detail, "does not exist") {
			t.Errorf("route to %s: HTTP %d %v, want 404 saying it does not exist", name, code, body)
		}
	}
	if code, body := post("no%20such"); code != http.StatusNotFound {
		t.Errorf("route to no sandbox name: HTTP %d %v, want 404", code, body)
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("the upstream got %d calls for sandboxes that do not exist", n)
	}
	if code, body := post("agent"); code != http.StatusOK || calls.Load() != 1 {
		t.Fatalf("route to an existing sandbox: HTTP %d %v, upstream calls %d", code, body, calls.Load())
	}
}

// llmBehind serves the daemon's LLM wiring over f (local gate) in front of
// a stub model that answers every call at once, after calling onCall.
func llmBehind(t *testing.T, f *fixture, onCall func()) *httptest.Server {
	t.Helper()
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		onCall()
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	}))
	t.Cleanup(stub.Close)
	llm, err := server.NewLLM(context.Background(), f.srv.Service(), server.LLMOptions{Upstream: stub.URL, Gate: llmproxy.GateLocal})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(llm.Close)
	proxy := httptest.NewServer(llm.Handler())
	t.Cleanup(proxy.Close)
	return proxy
}

// BenchmarkSandboxExists is the check the LLM proxy now makes before it
// forwards a model call (one catalog read).
func BenchmarkSandboxExists(b *testing.B) {
	f := serve(b, nil)
	f.create(b, "agent")
	ctx := context.Background()
	for b.Loop() {
		if ok, err := f.e.SandboxExists(ctx, "agent"); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}
