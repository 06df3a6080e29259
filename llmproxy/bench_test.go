package llmproxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// The benchmarks run the agent, the proxy and a stub upstream over real
// HTTP on 127.0.0.1. Each reports percentiles (b.ReportMetric) against a
// baseline measured in the same loop.

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func reportPct(b *testing.B, name string, d []time.Duration) {
	b.ReportMetric(float64(pct(d, 0.50).Microseconds()), name+"-p50-us")
	b.ReportMetric(float64(pct(d, 0.99).Microseconds()), name+"-p99-us")
}

func benchClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true}}
}

// do sends body and reads the reply, returning the time to its first byte
// and to its end.
func do(b *testing.B, c *http.Client, url string, body []byte) (first, total time.Duration) {
	start := time.Now()
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	var one [1]byte
	if _, err := io.ReadFull(resp.Body, one[:]); err != nil {
		b.Fatal(err)
	}
	first = time.Since(start)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("status %d", resp.StatusCode)
	}
	return first, time.Since(start)
}

// realisticChat is a 20-message conversation of ~12 KiB, the size of an
// early coding-agent turn.
func realisticChat(stream bool) []byte { return realisticChatN(stream, 0) }

// realisticChatN is realisticChat with the conversation made unique by n.
func realisticChatN(stream bool, n int) []byte {
	replies := make([]string, 10)
	for i := range replies {
		replies[i] = fmt.Sprintf("I will run the tests now (step %d). %s", i, bytes.Repeat([]byte("output line "), 80))
	}
	replies[9] += fmt.Sprint(" #", n)
	return []byte(chat(stream, replies...))
}

// BenchmarkProxyOverhead: a model call through the proxy without a
// checkpoint against the same call sent straight to the stub, and through a
// bare httputil.ReverseProxy (the cost of any extra loopback hop),
// alternating in one loop. overhead = proxy - direct; logic = proxy - bare,
// the proxy's own work (body read, parse, hash, routing).
//
// A fourth leg goes through a proxy with a journal that holds entries for
// the sandbox, as the daemon's does after an agent's first reply: the
// conversation hash is then read before the call is forwarded (the journal
// might answer it), and each reply is journaled (journal-overhead). Every
// call is a new conversation, so none is answered from the journal.
func BenchmarkProxyOverhead(b *testing.B) {
	up := newStub(b)
	up.forget = true
	_, base := newProxy(b, Options{Upstream: up.srv.URL})
	j := memJournal()
	_, jbase := newProxy(b, Options{Upstream: up.srv.URL, Journal: j})
	target, _ := url.Parse(up.srv.URL)
	bare := httptest.NewServer(httputil.NewSingleHostReverseProxy(target))
	b.Cleanup(bare.Close)
	c := benchClient()
	legs := []string{up.srv.URL + "/v1/chat/completions", bare.URL + "/v1/chat/completions", base + "/llm/agent1/v1/chat/completions",
		jbase + "/llm/agent1/v1/chat/completions"}
	times := make([][]time.Duration, len(legs))
	for w := range 20 { // warm the keep-alive pools (and give the journal its entries)
		for _, u := range legs {
			do(b, c, u, realisticChatN(false, -1-w))
		}
	}
	if j.Empty("agent1") {
		b.Fatal("the journal recorded nothing")
	}
	bodies := make([][]byte, b.N)
	for i := range bodies {
		bodies[i] = realisticChatN(false, i)
	}
	b.SetBytes(int64(len(bodies[0])))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for l, u := range legs {
			_, d := do(b, c, u, bodies[i])
			times[l] = append(times[l], d)
		}
	}
	b.StopTimer()
	direct, bareT, proxied, journaled := times[0], times[1], times[2], times[3]
	reportPct(b, "direct", direct)
	reportPct(b, "bare-hop", bareT)
	reportPct(b, "proxy", proxied)
	for _, q := range []struct {
		name string
		p    float64
	}{{"p50", 0.5}, {"p99", 0.99}} {
		b.ReportMetric(float64((pct(proxied, q.p) - pct(direct, q.p)).Microseconds()), "overhead-"+q.name+"-us")
		b.ReportMetric(float64((pct(proxied, q.p) - pct(bareT, q.p)).Microseconds()), "logic-"+q.name+"-us")
		b.ReportMetric(float64((pct(journaled, q.p) - pct(direct, q.p)).Microseconds()), "journal-overhead-"+q.name+"-us")
	}
}

// engineTurns is the seam implemented over a real engine, as the daemon
// will: each turn is an engine checkpoint of the sandbox.
type engineTurns struct {
	e  *engine.Engine
	mu *sync.Mutex
	fs *int // checkpoints that stored files: proof the turns were real
	// noLane, if set and true, keeps Turn.Urgent from the engine, so the
	// checkpoint never moves to the urgent lane (the benchmark's baseline).
	noLane *atomic.Bool
}

func (et engineTurns) Checkpoint(ctx context.Context, t Turn) (Committed, error) {
	opts := engine.CheckpointOptions{Message: "llm call " + t.Conv.Short(), Urgent: t.Urgent}
	if et.noLane != nil && et.noLane.Load() {
		opts.Urgent = nil
	}
	if t.Number >= 0 {
		opts.Turn = &t.Number
	}
	r, err := et.e.Checkpoint(ctx, delta.SandboxName(t.Sandbox), opts)
	if err != nil {
		return Committed{}, err
	}
	if r.Class == "fs" {
		et.mu.Lock()
		*et.fs++
		et.mu.Unlock()
	}
	return Committed{ID: r.ID, Class: string(r.Class)}, nil
}

func (engineTurns) WaitRemote(context.Context, Turn, Committed) error { return nil }

// fsTurnEngine opens a real engine home with one overlay sandbox and
// returns it with a function that makes one agent turn: 10 new files of
// 64 KiB random bytes.
func fsTurnEngine(b testing.TB) (*engine.Engine, func(i int)) {
	return fsTurnEngineSlots(b, 0)
}

// fsTurnEngineSlots is fsTurnEngine with engine.Options.MaxCheckpoints.
func fsTurnEngineSlots(b testing.TB, slots int) (*engine.Engine, func(i int)) {
	testenv.RequireRoot(b)
	ctx := context.Background()
	dir := b.TempDir()
	base := filepath.Join(dir, "base")
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(base, "src"), 0o755))
	must(os.WriteFile(filepath.Join(base, "src", "main.go"), []byte("package main\n"), 0o644))
	e, err := engine.Open(ctx, engine.Options{Home: filepath.Join(dir, "home"), MaxCheckpoints: slots})
	must(err)
	res, err := e.CreateSandbox(ctx, "bench", engine.CreateOptions{Base: base})
	if err != nil {
		e.Close()
		testenv.Missing(b, "overlayfs", err.Error())
	}
	b.Cleanup(func() { e.RemoveSandbox(context.Background(), "bench"); e.Close() })
	buf := make([]byte, 64<<10)
	return e, func(i int) {
		d := filepath.Join(res.Root, "work", fmt.Sprintf("turn%d", i))
		must(os.MkdirAll(d, 0o755))
		for f := range 10 {
			rand.Read(buf)
			must(os.WriteFile(filepath.Join(d, fmt.Sprintf("f%d.bin", f)), buf, 0o644))
		}
	}
}

// gateRun drives an agent through the proxy with a real 10-file fs turn
// before each model call and the upstream taking latency; it returns, per
// call, the delay the gate exposed (reply ready → released) and the
// checkpoint's remaining time when the reply was ready.
func gateRun(b *testing.B, latency time.Duration) (exposed, remaining []time.Duration) {
	e, agentTurn := fsTurnEngine(b)
	return gateRunOn(b, e, agentTurn, latency)
}

// gateRunOn is gateRun on an engine the caller made (with load, say).
func gateRunOn(b *testing.B, e *engine.Engine, agentTurn func(int), latency time.Duration) (exposed, remaining []time.Duration) {
	return gateRunLanes(b, e, agentTurn, latency, nil)
}

// gateRunLanes is gateRunOn where call i's checkpoint is kept out of the
// urgent lane when noLane(i) says so.
func gateRunLanes(b *testing.B, e *engine.Engine, agentTurn func(int), latency time.Duration, noLane func(i int) bool) (exposed, remaining []time.Duration) {
	up := newStub(b)
	up.delay = latency
	var mu sync.Mutex
	fsTurns := 0
	var off atomic.Bool
	p, base := newProxy(b, Options{Upstream: up.srv.URL, Turns: engineTurns{e, &mu, &fsTurns, &off}})
	p.onGate = func(ev gateEvent) {
		mu.Lock()
		defer mu.Unlock()
		exposed = append(exposed, ev.Released.Sub(ev.Ready))
		rem := time.Duration(0)
		if ev.CkptDone.After(ev.Ready) {
			rem = ev.CkptDone.Sub(ev.Ready)
		}
		remaining = append(remaining, rem)
	}
	c := benchClient()
	a := &agent{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		off.Store(noLane != nil && noLane(i))
		agentTurn(i)
		a.replies = append(a.replies, fmt.Sprint("reply ", i))
		do(b, c, base+"/llm/bench/v1/chat/completions", []byte(chat(false, a.replies...)))
	}
	b.StopTimer()
	p.Close()
	if fsTurns != b.N || len(exposed) != b.N {
		b.Fatalf("%d fs checkpoints and %d held replies for %d turns", fsTurns, len(exposed), b.N)
	}
	return exposed, remaining
}

// BenchmarkGateModel300ms: the checkpoint hides inside the model's latency;
// the gate's exposed delay is what the agent waits beyond the model.
func BenchmarkGateModel300ms(b *testing.B) {
	exposed, remaining := gateRun(b, 300*time.Millisecond)
	reportPct(b, "exposed", exposed)
	reportPct(b, "ckpt-remaining", remaining)
}

// BenchmarkGateModel20ms: the checkpoint outlasts the model; the exposed
// delay is the checkpoint's remaining time and no more (excess = exposed -
// remaining).
func BenchmarkGateModel20ms(b *testing.B) {
	exposed, remaining := gateRun(b, 20*time.Millisecond)
	excess := make([]time.Duration, len(exposed))
	for i := range exposed {
		excess[i] = exposed[i] - remaining[i]
	}
	reportPct(b, "exposed", exposed)
	reportPct(b, "ckpt-remaining", remaining)
	reportPct(b, "excess", excess)
}

// BenchmarkStreamFirstByte: time to the first byte of a streamed reply when
// the checkpoint finished before the model answered, gated (local) against
// the same stream from the stub directly, alternating in one loop.
func BenchmarkStreamFirstByte(b *testing.B) {
	up := newStub(b)
	up.forget = true
	turns := &fakeTurns{} // returns at once: the checkpoint finishes first
	p, base := newProxy(b, Options{Upstream: up.srv.URL, Turns: turns})
	up.before = func() { waitIdle(p) }
	var mu sync.Mutex
	var held []time.Duration
	p.onGate = func(ev gateEvent) {
		mu.Lock()
		held = append(held, ev.Released.Sub(ev.Ready))
		mu.Unlock()
	}
	c := benchClient()
	body := realisticChat(true)
	direct, gated := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
	for range 10 {
		do(b, c, up.srv.URL+"/v1/chat/completions", body)
		do(b, c, base+"/llm/agent1/v1/chat/completions", body)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d, _ := do(b, c, up.srv.URL+"/v1/chat/completions", body)
		g, _ := do(b, c, base+"/llm/agent1/v1/chat/completions", body)
		direct, gated = append(direct, d), append(gated, g)
	}
	b.StopTimer()
	reportPct(b, "direct-first-byte", direct)
	reportPct(b, "gated-first-byte", gated)
	reportPct(b, "gate-held", held[len(held)-b.N:])
	b.ReportMetric(float64((pct(gated, 0.5) - pct(direct, 0.5)).Microseconds()), "added-p50-us")
	b.ReportMetric(float64((pct(gated, 0.99) - pct(direct, 0.99)).Microseconds()), "added-p99-us")
}

// BenchmarkParseRequest: reading the turn position and conversation hash of
// a 12 KiB conversation, the proxy's only work on the request path.
func BenchmarkParseRequest(b *testing.B) {
	body := realisticChat(false)
	b.SetBytes(int64(len(body)))
	for i := 0; i < b.N; i++ {
		if _, err := ParseRequest(ShapeChat, body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseReference is the baseline for BenchmarkParseRequest: the
// same work by decoding into any and re-encoding.
func BenchmarkParseReference(b *testing.B) {
	body := realisticChat(false)
	b.SetBytes(int64(len(body)))
	for i := 0; i < b.N; i++ {
		if _, err := parseReference(ShapeChat, body); err != nil {
			b.Fatal(err)
		}
	}
}
