package llmproxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Every test here runs real HTTP on 127.0.0.1: the agent's client, the
// proxy and a stub upstream, each its own server.

func TestForwardsEveryShape(t *testing.T) {
	up := newStub(t)
	turns := &fakeTurns{}
	_, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: turns})
	cases := []struct {
		path, body, want string
		turn             int
		stream           bool
	}{
		{"/v1/chat/completions", chat(false, "a", "b"), `"content":"live #`, 2, false},
		{"/v1/chat/completions", chat(true), "data: [DONE]", 0, true},
		{"/v1/responses", `{"model":"gpt-test","input":[{"role":"user","content":"hi"},{"type":"reasoning","id":"r1","summary":[]},{"type":"function_call","call_id":"c1","name":"ls","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"x"}]}`, `"output_text","text":"live #`, 1, false},
		{"/v1/messages", `{"model":"claude-test","max_tokens":64,"system":"be brief","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"ls","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"x"}]}]}`, `"text":"live #`, 1, false},
		{"/v1/messages", `{"model":"claude-test","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, "event: message_stop", 0, true},
	}
	hdr := map[string]string{"Authorization": "Bearer sk-test-123", "x-api-key": "sk-ant-456", "anthropic-version": "2023-06-01"}
	for i, c := range cases {
		status, h, got := post(t, base+"/llm/agent1"+c.path+"?api-version=7", c.body, hdr)
		if status != 200 || !strings.Contains(got, c.want) {
			t.Fatalf("%s: status %d body %q, want %q", c.path, status, got, c.want)
		}
		if c.stream != (h.Get("Content-Type") == "text/event-stream") {
			t.Errorf("%s: content type %q", c.path, h.Get("Content-Type"))
		}
		seen := up.requests()[i]
		if seen.Path != c.path || seen.Query != "api-version=7" || string(seen.Body) != c.body {
			t.Errorf("upstream got %s ?%s %q; want %s, the query and the body unchanged", seen.Path, seen.Query, seen.Body, c.path)
		}
		for k, v := range hdr {
			if seen.Header.Get(k) != v {
				t.Errorf("%s: upstream header %s = %q, want %q", c.path, k, seen.Header.Get(k), v)
			}
		}
		tr := turns.seen()
		if len(tr) != i+1 {
			t.Fatalf("%s: %d checkpoints after %d model calls", c.path, len(tr), i+1)
		}
		sh, _ := shapeOf(c.path)
		want, err := ParseRequest(sh, []byte(c.body))
		if err != nil {
			t.Fatal(err)
		}
		if got := tr[i]; got.Sandbox != "agent1" || got.Number != c.turn || got.Conv != want.Conv || got.Shape != sh {
			t.Errorf("%s: checkpoint %+v, want sandbox agent1 turn %d conv %s", c.path, got, c.turn, want.Conv.Short())
		}
	}
}

func TestNonTurnsTakeNoCheckpoint(t *testing.T) {
	up := newStub(t)
	turns := &fakeTurns{}
	reg := prometheus.NewRegistry()
	_, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: turns, Registerer: reg, NonTurn: []string{"/v1/ratelimited/chat/completions"}})
	resp, err := http.Get(base + "/llm/agent1/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "gpt-test") {
		t.Fatalf("models: %q", b)
	}
	for _, p := range []string{"/v1/embeddings", "/v1/messages/count_tokens", "/v1/ratelimited/chat/completions"} {
		post(t, base+"/llm/agent1"+p, chat(false), nil)
	}
	// A model path whose body is not JSON is forwarded for the upstream to
	// refuse, without a checkpoint.
	post(t, base+"/llm/agent1/v1/chat/completions", "not json", nil)
	if n := len(turns.seen()); n != 0 {
		t.Fatalf("%d checkpoints for calls that are not turns", n)
	}
	if n := len(up.requests()); n != 5 {
		t.Fatalf("upstream saw %d requests, want 5", n)
	}
	if got := counter(t, reg, "turnsnap_llm_requests_total", "passthrough"); got != 4 {
		t.Errorf("passthrough count %v, want 4", got)
	}
}

// counter reads the series of counter name in reg that has a label with
// value label (0 if there is none).
func counter(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetValue() == label {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// A streamed reply reaches the agent event by event: the agent reads the
// first event while the upstream has not written the second.
func TestStreamPassesChunkByChunk(t *testing.T) {
	up := newStub(t)
	up.events = make(chan struct{})
	_, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: &fakeTurns{}})
	resp, err := http.Post(base+"/llm/agent1/v1/messages", "application/json", strings.NewReader(`{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	for ev := 0; ev < 6; ev++ {
		var lines []string
		for {
			l, err := rd.ReadString('\n')
			if err != nil {
				t.Fatalf("event %d: %v", ev, err)
			}
			if l == "\n" {
				break
			}
			lines = append(lines, l)
		}
		if ev == 0 && !strings.Contains(lines[0], "message_start") {
			t.Fatalf("first event %q", lines)
		}
		if ev < 5 {
			up.events <- struct{}{} // only now may the upstream write the next event
		}
	}
}

// startCall sends a model call in the background; headers is closed when the
// reply head reaches the agent.
func startCall(t *testing.T, url, body string) (headers chan struct{}, result chan string) {
	headers, result = make(chan struct{}), make(chan string, 1)
	go func() {
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			close(headers)
			result <- "error: " + err.Error()
			return
		}
		close(headers)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		result <- fmt.Sprintf("%d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}()
	return headers, result
}

// The gate holds the reply (whole or streamed) until the checkpoint commits:
// the checkpoint blocks on a channel the test holds; once the reply is at
// the gate (its Urgent signal fired), no byte has reached the agent.
func TestGateHoldsReplyUntilCommitted(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			up := newStub(t)
			turns := &fakeTurns{block: make(chan struct{}), started: make(chan Turn, 1)}
			_, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: turns})
			headers, result := startCall(t, base+"/llm/agent1/v1/chat/completions", chat(stream, "x"))
			tr := <-turns.started
			<-tr.Urgent // the upstream replied; the reply waits at the gate
			select {
			case <-headers:
				t.Fatal("reply reached the agent before the checkpoint committed")
			default:
			}
			if up.calls.Load() != 1 {
				t.Fatal("the model call was not forwarded while the checkpoint ran")
			}
			close(turns.block)
			got := <-result
			if !strings.HasPrefix(got, "200 ") || !strings.Contains(got, "#1") {
				t.Fatalf("released reply %q", got)
			}
			if turns.urgent.Load() != 1 {
				t.Error("the checkpoint was not told it is urgent")
			}
		})
	}
}

// A checkpoint that finished first is not urgent and the reply is not held.
func TestGateOpenWhenCheckpointFirst(t *testing.T) {
	up := newStub(t)
	turns := &fakeTurns{}
	p, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: turns})
	var ev []gateEvent
	var mu sync.Mutex
	p.onGate = func(e gateEvent) { mu.Lock(); ev = append(ev, e); mu.Unlock() }
	// The model answers only once the proxy has finished the checkpoint.
	up.before = func() { waitIdle(p) }
	post(t, base+"/llm/agent1/v1/chat/completions", chat(false), nil)
	mu.Lock()
	defer mu.Unlock()
	if len(ev) != 1 || ev[0].Outcome != "committed" || ev[0].CkptDone.IsZero() || ev[0].CkptDone.After(ev[0].Ready) {
		t.Fatalf("gate events %+v: want one, committed before the reply was ready", ev)
	}
	if turns.urgent.Load() != 0 {
		t.Error("a checkpoint that finished first was marked urgent")
	}
}

// waitIdle waits until p runs no checkpoint.
func waitIdle(p *Proxy) {
	for {
		p.mu.Lock()
		n := len(p.inflight)
		p.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func TestGateTimeoutAndFailure(t *testing.T) {
	cases := []struct {
		name   string
		turns  *fakeTurns
		strict bool
		status int
		metric string
	}{
		{"timeout", &fakeTurns{block: make(chan struct{})}, false, 200, "timeout"},
		{"timeout-strict", &fakeTurns{block: make(chan struct{})}, true, 503, "timeout"},
		{"failed", &fakeTurns{err: errors.New("disk full")}, false, 200, "failed"},
		{"failed-strict", &fakeTurns{err: errors.New("disk full")}, true, 503, "failed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := newStub(t)
			reg := prometheus.NewRegistry()
			_, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: c.turns, Strict: c.strict, GateTimeout: 50 * time.Millisecond, Registerer: reg})
			status, h, body := post(t, base+"/llm/agent1/v1/chat/completions", chat(false), nil)
			if status != c.status {
				t.Fatalf("status %d, want %d (%s)", status, c.status, body)
			}
			if c.status == 503 {
				var prob map[string]any
				if h.Get("Content-Type") != "application/problem+json" || json.Unmarshal([]byte(body), &prob) != nil || prob["status"] != 503.0 {
					t.Fatalf("503 body %q (%s), want a problem document", body, h.Get("Content-Type"))
				}
			} else if !strings.Contains(body, "live #1") {
				t.Fatalf("released reply %q", body)
			}
			if got := counter(t, reg, "turnsnap_llm_gate_outcomes_total", c.metric); got != 1 {
				t.Errorf("outcome %s counted %v times, want 1", c.metric, got)
			}
			if c.turns.block != nil {
				close(c.turns.block)
			}
		})
	}
}

func TestGateRemoteWaitsForUpload(t *testing.T) {
	up := newStub(t)
	turns := &fakeTurns{remote: make(chan struct{}), started: make(chan Turn, 1)}
	_, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: turns, Gate: GateRemote})
	headers, result := startCall(t, base+"/llm/agent1/v1/messages", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`)
	tr := <-turns.started
	<-tr.Urgent
	select {
	case <-headers:
		t.Fatal("reply released before the checkpoint was remote")
	default:
	}
	close(turns.remote)
	if got := <-result; !strings.Contains(got, "live #1") {
		t.Fatalf("reply %q", got)
	}
}

func TestUpstreamErrorsPassThrough(t *testing.T) {
	up := newStub(t)
	_, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: &fakeTurns{}})
	status, h, body := post(t, base+"/llm/agent1/v1/ratelimited/chat/completions", chat(false), nil)
	if status != 429 || h.Get("Retry-After") != "7" || body != `{"error":{"type":"rate_limit_error","message":"slow down"}}` {
		t.Fatalf("upstream error changed: %d %v %q", status, h, body)
	}
	// An upstream that is not there: 502 with a problem document.
	dead := newStub(t)
	dead.srv.Close()
	reg := prometheus.NewRegistry()
	_, base2 := newProxy(t, Options{Upstream: dead.srv.URL, Turns: &fakeTurns{}, Registerer: reg})
	status, h, _ = post(t, base2+"/llm/agent1/v1/chat/completions", chat(false), nil)
	if status != 502 || h.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("unreachable upstream: %d %s", status, h.Get("Content-Type"))
	}
	// Routes that are not sandbox routes.
	for _, p := range []string{"/llm/", "/llm/agent1", "/other/agent1/v1/models", "/llm/bad%2Fname/v1/models",
		"/llm/agent1/v1/../../admin", "/llm/agent1/v1/%2e%2e/admin", "/llm/agent1/./v1/models"} {
		req, _ := http.NewRequest("GET", base, nil)
		req.URL.Opaque = p // sent as written, dot segments and all
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: status %d (%s), want the proxy's own 404", p, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
}

// Several sandboxes at once, each with its own upstream, each call a turn of
// its own sandbox.
func TestSeveralSandboxesAtOnce(t *testing.T) {
	upA, upB := newStub(t), newStub(t)
	turns := &fakeTurns{}
	_, base := newProxy(t, Options{Upstream: upA.srv.URL, Turns: turns,
		UpstreamFor: func(_ context.Context, sb string) (string, error) {
			if strings.HasPrefix(sb, "b") {
				return upB.srv.URL, nil
			}
			return "", nil
		}})
	var wg sync.WaitGroup
	names := []string{"a1", "a2", "b1", "b2"}
	for _, sb := range names {
		for turn := 0; turn < 5; turn++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				replies := make([]string, turn)
				for i := range replies {
					replies[i] = fmt.Sprintf("%s-%d", sb, i)
				}
				if status, _, body := post(t, base+"/llm/"+sb+"/v1/chat/completions", chat(turn%2 == 0, replies...), nil); status != 200 {
					t.Errorf("%s: %d %s", sb, status, body)
				}
			}()
		}
	}
	wg.Wait()
	if upA.calls.Load() != 10 || upB.calls.Load() != 10 {
		t.Fatalf("upstream A answered %d, B %d; want 10 each", upA.calls.Load(), upB.calls.Load())
	}
	got := map[string]map[int]bool{}
	for _, tr := range turns.seen() {
		if got[tr.Sandbox] == nil {
			got[tr.Sandbox] = map[int]bool{}
		}
		got[tr.Sandbox][tr.Number] = true
	}
	for _, sb := range names {
		if len(got[sb]) != 5 {
			t.Errorf("sandbox %s: checkpoints for turns %v, want 0..4", sb, got[sb])
		}
	}
}

// An agent's retry of a call still waiting for its checkpoint joins that
// checkpoint instead of starting another.
func TestRetryJoinsRunningCheckpoint(t *testing.T) {
	up := newStub(t)
	turns := &fakeTurns{block: make(chan struct{}), started: make(chan Turn, 2)}
	p, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: turns})
	var read atomic.Int64
	p.afterParse = func() { read.Add(1) }
	_, r1 := startCall(t, base+"/llm/agent1/v1/chat/completions", chat(false))
	tr := <-turns.started
	<-tr.Urgent
	_, r2 := startCall(t, base+"/llm/agent1/v1/chat/completions", chat(false))
	// The retry is forwarded before its conversation is read: wait for both
	// (polling counters, not timing the gate).
	for up.calls.Load() < 2 || read.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	close(turns.block)
	<-r1
	<-r2
	if n := len(turns.seen()); n != 1 {
		t.Fatalf("%d checkpoints for one call and its retry", n)
	}
}

// Credentials go to the upstream and nowhere else: not into any log line,
// whatever happens to the call.
func TestSecretsNeverLogged(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	up := newStub(t)
	dead := newStub(t)
	dead.srv.Close()
	secret := "sk-very-secret-0123456789"
	hdr := map[string]string{"Authorization": "Bearer " + secret, "x-api-key": secret}
	_, base := newProxy(t, Options{Upstream: up.srv.URL, Logger: log, GateTimeout: 10 * time.Millisecond, Turns: &fakeTurns{err: errors.New("boom")},
		UpstreamFor: func(_ context.Context, sb string) (string, error) {
			if sb == "dead" {
				return dead.srv.URL, nil
			}
			return "", nil
		}})
	post(t, base+"/llm/agent1/v1/chat/completions", chat(false), hdr)
	post(t, base+"/llm/dead/v1/chat/completions", chat(false), hdr)
	post(t, base+"/llm/agent1/v1/models", "", hdr)
	if logs.Len() == 0 {
		t.Fatal("nothing logged: the test would not notice a leak")
	}
	if strings.Contains(logs.String(), secret) {
		t.Fatalf("a credential reached the log:\n%s", logs.String())
	}
}

// An agent that hangs up while its reply is held gets nothing, and its
// turn's checkpoint still completes: the checkpoint does not run under the
// agent's request.
func TestAgentHangsUpWhileHeld(t *testing.T) {
	up := newStub(t)
	turns := &fakeTurns{block: make(chan struct{}), started: make(chan Turn, 1)}
	reg := prometheus.NewRegistry()
	p, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: turns, Registerer: reg})
	released := make(chan gateEvent, 1)
	p.onGate = func(e gateEvent) { released <- e }
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/llm/agent1/v1/chat/completions", strings.NewReader(chat(false)))
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	tr := <-turns.started
	<-tr.Urgent
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the agent got a reply after hanging up")
	}
	if ev := <-released; ev.Outcome != "client_gone" {
		t.Fatalf("gate outcome %q, want client_gone", ev.Outcome)
	}
	close(turns.block)
	waitIdle(p)
	mfs, _ := reg.Gather()
	ok := false
	for _, mf := range mfs {
		if mf.GetName() == "turnsnap_llm_checkpoint_seconds" {
			for _, m := range mf.Metric {
				if m.Label[0].GetValue() == "ok" && m.GetHistogram().GetSampleCount() == 1 {
					ok = true
				}
			}
		}
	}
	if !ok {
		t.Fatal("the checkpoint did not complete after the agent hung up")
	}
}

// A body larger than MaxBody is streamed through unchanged and still ends a
// turn, with an unknown position.
func TestOversizedBodyStillATurn(t *testing.T) {
	up := newStub(t)
	turns := &fakeTurns{}
	_, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: turns, MaxBody: 1024, Journal: newJournal(t)})
	big := realisticChat(false)
	status, _, _ := post(t, base+"/llm/agent1/v1/chat/completions", string(big), nil)
	if status != 200 {
		t.Fatalf("status %d", status)
	}
	if got := up.requests()[0].Body; !bytes.Equal(got, big) {
		t.Fatalf("upstream got %d bytes, want the %d sent", len(got), len(big))
	}
	tr := turns.seen()
	if len(tr) != 1 || tr[0].Number != -1 {
		t.Fatalf("checkpoints %+v, want one with turn -1", tr)
	}
}

func TestUnknownSandboxUpstream(t *testing.T) {
	_, base := newProxy(t, Options{UpstreamFor: func(_ context.Context, sb string) (string, error) {
		return "", fmt.Errorf("sandbox %s: %w", sb, errdefs.ErrNotFound)
	}})
	status, h, body := post(t, base+"/llm/ghost/v1/chat/completions", chat(false), nil)
	if status != 404 || h.Get("Content-Type") != "application/problem+json" || !strings.Contains(body, "ghost") {
		t.Fatalf("unknown sandbox: %d %s %s", status, h.Get("Content-Type"), body)
	}
}

// Calls from many sandboxes share kept-alive connections to the upstream.
func TestUpstreamKeepAlive(t *testing.T) {
	up := newStub(t)
	_, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: &fakeTurns{}})
	for i := 0; i < 20; i++ {
		sb := fmt.Sprintf("sb%d", i%5)
		post(t, base+"/llm/"+sb+"/v1/chat/completions", chat(i%2 == 0), map[string]string{"Authorization": "Bearer k" + sb})
		post(t, base+"/llm/"+sb+"/v1/models", "", nil)
	}
	if n := up.conns.Load(); n != 1 {
		t.Fatalf("40 sequential calls opened %d upstream connections, want 1", n)
	}
}

// memJournal is a TreeJournal that never reads from a store: its entries
// stay in memory, as they do until a checkpoint commits them.
func memJournal() *TreeJournal { return NewTreeJournal(delta.IDs{}, nil) }

// TestForwardsBeforeReadingConversation: with nothing in the journal to
// answer from, the upstream gets the call before the proxy reads its
// conversation (the parse is held until the stub has seen the call: a proxy
// that parsed first would never get there), and the turn still carries the
// conversation's position and hash. Once the sandbox has a journal entry,
// the hash is read first: the journal may answer the call.
func TestForwardsBeforeReadingConversation(t *testing.T) {
	up := newStub(t)
	turns := &fakeTurns{}
	j := memJournal()
	p, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: turns, Journal: j})
	seen := make(chan struct{}, 1)
	up.before = func() {
		select {
		case seen <- struct{}{}:
		default:
		}
	}
	var beside atomic.Int64
	p.beforeParse = func() {
		beside.Add(1)
		select {
		case <-seen:
		case <-time.After(10 * time.Second):
			t.Error("the upstream did not get the call before its conversation was read")
		}
	}
	body := chat(false, "one", "two")
	if s, _, b := post(t, base+"/llm/a1/v1/chat/completions", body, nil); s != 200 {
		t.Fatalf("status %d: %s", s, b)
	}
	want, err := ParseRequest(ShapeChat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	ts := turns.seen()
	if len(ts) != 1 || ts[0].Number != 2 || ts[0].Conv != want.Conv {
		t.Fatalf("turns %+v, want one of turn 2 conv %s", ts, want.Conv.Short())
	}
	if beside.Load() != 1 || j.Empty("a1") {
		t.Fatalf("%d calls read beside, journal empty %v: want 1 and an entry", beside.Load(), j.Empty("a1"))
	}
	// The journal now holds a1's exchange, but a live timeline's repeat
	// goes to the model: it is still forwarded before being read.
	if s, h, b := post(t, base+"/llm/a1/v1/chat/completions", body, nil); s != 200 || !strings.Contains(b, "live #2") || h.Get(ReplayHeader) != "" {
		t.Fatalf("repeat on a live timeline: %d %s", s, b)
	}
	if beside.Load() != 2 {
		t.Fatalf("the repeat was read %d times beside the forwarded call, want 2 in all", beside.Load())
	}
	// A call that opts in to the journal may be answered from it, so its
	// hash must be read before anything is forwarded.
	calls := up.calls.Load()
	if s, h, b := post(t, base+"/llm/a1/v1/chat/completions", body, map[string]string{ReplayHeader: "replay"}); s != 200 || !strings.Contains(b, "live #2") || h.Get(ReplayHeader) != "replay" {
		t.Fatalf("replay: %d %s", s, b)
	}
	if up.calls.Load() != calls || beside.Load() != 2 {
		t.Fatalf("the replayed call reached the upstream (%d calls) or was read beside (%d)", up.calls.Load()-calls, beside.Load())
	}
}

// readBody reads a declared length in one buffer, an undeclared one up to
// the bound, and says when a body is larger than the bound (max+1 bytes).
func TestReadBody(t *testing.T) {
	body := strings.Repeat("x", 100)
	cases := []struct {
		length, max int64
		want        int
		err         bool
	}{
		{100, 1000, 100, false}, // declared
		{-1, 1000, 100, false},  // chunked
		{-1, 50, 51, false},     // chunked, larger than the bound
		{200, 1000, 0, true},    // declared more than was sent
		{100, 50, 51, false},    // declared larger than the bound
		{0, 50, 0, false},
	}
	for _, c := range cases {
		src := body
		if c.length == 0 {
			src = ""
		}
		b, err := readBody(strings.NewReader(src), c.length, c.max)
		if (err != nil) != c.err || (!c.err && (len(b) != c.want || string(b) != src[:c.want])) {
			t.Errorf("length %d max %d: %d bytes, %v; want %d (error %v)", c.length, c.max, len(b), err, c.want, c.err)
		}
	}
}
