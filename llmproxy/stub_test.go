package llmproxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/upload"
)

// stub is an upstream model API on 127.0.0.1 speaking the OpenAI and
// Anthropic shapes. Each model reply carries a serial number ("live #N") so
// a test can tell a live reply from a journaled one.
type stub struct {
	srv    *httptest.Server
	calls  atomic.Int64 // model calls answered
	conns  atomic.Int64 // TCP connections accepted
	mu     sync.Mutex
	seen   []seenReq
	delay  time.Duration // before the reply head
	before func()        // if set, runs before each reply
	forget bool          // keep no requests (benchmarks)
	events chan struct{} // if set, each SSE event after the first waits for a receive
}

type seenReq struct {
	Method, Path, Query string
	Header              http.Header
	Body                []byte
}

func newStub(t testing.TB) *stub {
	s := &stub{}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	s.srv.Start()
	t.Cleanup(s.srv.Close)
	return s
}

func (s *stub) requests() []seenReq {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seenReq(nil), s.seen...)
}

func (s *stub) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if !s.forget {
		s.mu.Lock()
		s.seen = append(s.seen, seenReq{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), body})
		s.mu.Unlock()
	}
	if s.before != nil {
		s.before()
	}
	if s.delay > 0 {
		time.Sleep(s.delay) // the model's latency
	}
	var req struct {
		Stream bool `json:"stream"`
	}
	json.Unmarshal(body, &req)
	switch r.URL.Path {
	case "/v1/models":
		writeJSON(w, 200, `{"object":"list","data":[{"id":"gpt-test","object":"model"}]}`)
	case "/v1/embeddings":
		writeJSON(w, 200, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2]}]}`)
	case "/v1/messages/count_tokens":
		writeJSON(w, 200, `{"input_tokens":12}`)
	case "/v1/ratelimited/chat/completions":
		w.Header().Set("Retry-After", "7")
		writeJSON(w, 429, `{"error":{"type":"rate_limit_error","message":"slow down"}}`)
	case "/v1/chat/completions":
		n := s.calls.Add(1)
		if req.Stream {
			s.stream(w, []string{
				fmt.Sprintf(`data: {"id":"c%d","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"live "}}]}`, n),
				fmt.Sprintf(`data: {"id":"c%d","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"#%d"},"finish_reason":"stop"}]}`, n, n),
				`data: [DONE]`,
			})
			return
		}
		writeJSON(w, 200, fmt.Sprintf(`{"id":"c%d","object":"chat.completion","model":"gpt-test","choices":[{"index":0,"message":{"role":"assistant","content":"live #%d"},"finish_reason":"stop"}]}`, n, n))
	case "/v1/responses":
		n := s.calls.Add(1)
		writeJSON(w, 200, fmt.Sprintf(`{"id":"resp_%d","object":"response","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"live #%d"}]}]}`, n, n))
	case "/v1/messages":
		n := s.calls.Add(1)
		if req.Stream {
			s.stream(w, []string{
				"event: message_start\n" + fmt.Sprintf(`data: {"type":"message_start","message":{"id":"msg_%d","type":"message","role":"assistant","content":[]}}`, n),
				"event: content_block_start\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
				"event: content_block_delta\n" + fmt.Sprintf(`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"live #%d"}}`, n),
				"event: content_block_stop\n" + `data: {"type":"content_block_stop","index":0}`,
				"event: message_delta\n" + `data: {"type":"message_delta","delta":{"stop_reason":"end_turn"}}`,
				"event: message_stop\n" + `data: {"type":"message_stop"}`,
			})
			return
		}
		writeJSON(w, 200, fmt.Sprintf(`{"id":"msg_%d","type":"message","role":"assistant","content":[{"type":"text","text":"live #%d"}],"stop_reason":"end_turn"}`, n, n))
	default:
		writeJSON(w, 404, `{"error":"no such path"}`)
	}
}

func writeJSON(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	io.WriteString(w, body)
}

// stream writes SSE events one by one, flushing each.
func (s *stub) stream(w http.ResponseWriter, events []string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(200)
	f := w.(http.Flusher)
	for i, ev := range events {
		if i > 0 && s.events != nil {
			<-s.events
		}
		io.WriteString(w, ev+"\n\n")
		f.Flush()
	}
}

// fakeTurns is a Turns the test controls: Checkpoint can block on a
// channel, fail, and it records the journal refs at each checkpoint as the
// daemon's record would.
type fakeTurns struct {
	mu      sync.Mutex
	turns   []Turn
	block   chan struct{} // if set, Checkpoint waits for it to be closed (or ctx)
	started chan Turn     // if set, receives each turn as its checkpoint starts
	err     error
	remote  chan struct{} // if set, WaitRemote waits for it
	urgent  atomic.Int64  // checkpoints whose Urgent closed while they ran
	journal *StoreJournal
	refs    map[string]map[int][]delta.ID // sandbox → turn → journal refs
}

func (f *fakeTurns) Checkpoint(ctx context.Context, t Turn) (Committed, error) {
	f.mu.Lock()
	f.turns = append(f.turns, t)
	if f.journal != nil {
		if f.refs == nil {
			f.refs = map[string]map[int][]delta.ID{}
		}
		if f.refs[t.Sandbox] == nil {
			f.refs[t.Sandbox] = map[int][]delta.ID{}
		}
		f.refs[t.Sandbox][t.Number] = f.journal.Refs(t.Sandbox)
	}
	block, err := f.block, f.err
	f.mu.Unlock()
	if f.started != nil {
		f.started <- t
	}
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return Committed{}, ctx.Err()
		}
	}
	select {
	case <-t.Urgent:
		f.urgent.Add(1)
	default:
	}
	if err != nil {
		return Committed{}, err
	}
	return Committed{ID: t.Conv, Class: "fs"}, nil
}

func (f *fakeTurns) WaitRemote(ctx context.Context, t Turn, c Committed) error {
	if f.remote != nil {
		select {
		case <-f.remote:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (f *fakeTurns) seen() []Turn {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Turn(nil), f.turns...)
}

// newProxy serves a proxy in front of st on 127.0.0.1 and returns its base URL.
func newProxy(t testing.TB, opts Options) (*Proxy, string) {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(tWriter{t}, nil))
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(func() { srv.Close(); p.Close() })
	return p, srv.URL
}

// tWriter sends log lines to the test's log.
type tWriter struct{ t testing.TB }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func newJournal(t testing.TB) *StoreJournal {
	t.Helper()
	st, err := upload.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	j, err := NewStoreJournal(st)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// post sends a model call and returns the status, headers and whole body.
func post(t testing.TB, url, body string, hdr map[string]string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// chat builds an OpenAI chat request whose history has the given assistant
// replies, each followed by a user message.
func chat(stream bool, replies ...string) string {
	msgs := []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": "start"}}
	for i, r := range replies {
		msgs = append(msgs, map[string]any{"role": "assistant", "content": r},
			map[string]any{"role": "user", "content": fmt.Sprintf("tool result %d", i)})
	}
	b, _ := json.Marshal(map[string]any{"model": "gpt-test", "messages": msgs, "stream": stream})
	return string(b)
}
