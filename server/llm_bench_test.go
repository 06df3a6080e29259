package server_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/llmproxy"
	"github.com/turnsnap/turnsnap/server"
)

// BenchmarkLLMDaemonGate measures the daemon's wiring (server.LLM: the
// checkpoint path of the API, the journal tree stored with each checkpoint)
// behind the proxy, with a stub model of 300 ms and a 10-file fs turn (64
// KiB each; 2 files with TURNSNAP_BENCH_SMALL=1) before each call. The
// baseline is the same call straight to the stub, alternating in one loop:
// added = proxied - direct is the proxy's overhead plus the delay its gate
// exposed.
func BenchmarkLLMDaemonGate(b *testing.B) {
	for _, lat := range []time.Duration{300 * time.Millisecond, 20 * time.Millisecond} {
		b.Run(lat.String(), func(b *testing.B) { benchDaemonGate(b, lat, llmproxy.GateLocal) })
	}
	// The same 300 ms calls with the gate open: what the proxy, the journal
	// and the concurrent checkpoint cost without any wait for it.
	b.Run("300ms-gate-none", func(b *testing.B) { benchDaemonGate(b, 300*time.Millisecond, llmproxy.GateNone) })
}

func benchDaemonGate(b *testing.B, latency time.Duration, gate llmproxy.Gate) {
	f := serve(b, nil)
	root := f.create(b, "bench")
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		time.Sleep(latency)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	}))
	b.Cleanup(stub.Close)
	llm, err := server.NewLLM(context.Background(), f.srv.Service(), server.LLMOptions{Upstream: stub.URL, Gate: gate})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(llm.Close)
	proxy := httptest.NewServer(llm.Handler())
	b.Cleanup(proxy.Close)
	files := 10
	if os.Getenv("TURNSNAP_BENCH_SMALL") != "" {
		files = 2
	}
	buf := make([]byte, 64<<10)
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	msgs := []map[string]string{{"role": "user", "content": "go"}}
	call := func(url string) time.Duration {
		body, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
		start := time.Now()
		resp, err := c.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
		return time.Since(start)
	}
	var direct, proxied []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d := filepath.Join(root, fmt.Sprintf("turn%d", i))
		os.MkdirAll(d, 0o755)
		for k := 0; k < files; k++ {
			rand.Read(buf)
			os.WriteFile(filepath.Join(d, fmt.Sprintf("f%d", k)), buf, 0o644)
		}
		direct = append(direct, call(stub.URL+"/v1/chat/completions"))
		proxied = append(proxied, call(proxy.URL+"/llm/bench/v1/chat/completions"))
		msgs = append(msgs, map[string]string{"role": "assistant", "content": "ok"}, map[string]string{"role": "user", "content": fmt.Sprint("tool ", i)})
	}
	b.StopTimer()
	log, err := f.c.Log(context.Background(), "bench")
	if err != nil {
		b.Fatal(err)
	}
	journaled := 0
	for _, l := range log {
		if l.Conv != nil {
			journaled++
		}
	}
	if journaled != b.N {
		b.Fatalf("%d model-call checkpoints for %d calls", journaled, b.N)
	}
	pct := func(d []time.Duration, p float64) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[min(len(s)-1, int(float64(len(s))*p))]
	}
	for _, q := range []struct {
		n string
		p float64
	}{{"p50", 0.5}, {"p99", 0.99}} {
		b.ReportMetric(float64(pct(direct, q.p).Microseconds()), "direct-"+q.n+"-us")
		b.ReportMetric(float64(pct(proxied, q.p).Microseconds()), "proxied-"+q.n+"-us")
		b.ReportMetric(float64((pct(proxied, q.p) - pct(direct, q.p)).Microseconds()), "added-"+q.n+"-us")
	}
}
