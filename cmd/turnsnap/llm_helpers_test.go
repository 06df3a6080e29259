package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
)

// llmStub is a model upstream on 127.0.0.1 answering the OpenAI chat and
// Anthropic messages shapes, streamed or not. Every reply names the stub,
// the conversation's position and the stub's call counter, so a live reply
// never equals an earlier one byte for byte: a reply equal to the first
// run's came from the journal.
type llmStub struct {
	name  string
	srv   *httptest.Server
	calls atomic.Int64
	delay time.Duration
}

func newLLMStub(t *testing.T, name string) *llmStub {
	s := &llmStub{name: name}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *llmStub) serve(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Messages []struct{ Role string } `json:"messages"`
		Stream   bool                    `json:"stream"`
	}
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, `{"error":"bad json"}`, http.StatusBadRequest)
		return
	}
	n := s.calls.Add(1)
	if s.delay > 0 {
		time.Sleep(s.delay)
	}
	pos := 0
	for _, m := range req.Messages {
		if m.Role == "assistant" {
			pos++
		}
	}
	text := fmt.Sprintf("%s reply %d (call %d)", s.name, pos, n)
	anthropic := strings.HasSuffix(r.URL.Path, "/v1/messages")
	switch {
	case anthropic && req.Stream:
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []string{
			`event: message_start` + "\n" + `data: {"type":"message_start","message":{"id":"msg_1","role":"assistant","content":[]}}`,
			`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` + text + `"}}`,
			`event: message_stop` + "\n" + `data: {"type":"message_stop"}`,
		} {
			fmt.Fprint(w, ev+"\n\n")
			w.(http.Flusher).Flush()
		}
	case anthropic:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_%d","type":"message","role":"assistant","content":[{"type":"text","text":%q}],"stop_reason":"end_turn"}`, n, text)
	case req.Stream:
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []string{`{"choices":[{"index":0,"delta":{"role":"assistant","content":"` + text + `"}}]}`, `[DONE]`} {
			fmt.Fprint(w, "data: "+ev+"\n\n")
			w.(http.Flusher).Flush()
		}
	default:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c-%d","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}]}`, n, text)
	}
}

// llmAgent is an agent's loop: a tool call (a file written in the sandbox)
// and then a model call carrying the whole conversation.
type llmAgent struct {
	t         *testing.T
	route     string // http://ADDR/llm/NAME
	root      string // the sandbox's root, for the tool calls
	anthropic bool
	stream    bool
	opening   string
	msgs      []map[string]string
}

type llmCall struct {
	status int
	raw    string
	replay bool
	text   string
	hdr    http.Header
}

var replyText = regexp.MustCompile(`[a-z0-9]+ reply \d+ \(call \d+\)`)

// step runs tool call i then the model call that follows it.
func (a *llmAgent) step(i int) llmCall {
	a.t.Helper()
	if a.root != "" {
		if err := os.WriteFile(filepath.Join(a.root, fmt.Sprintf("tool%d", i)), []byte(fmt.Sprintf("output of tool %d\n", i)), 0o644); err != nil {
			a.t.Fatal(err)
		}
	}
	if a.msgs == nil {
		a.msgs = []map[string]string{{"role": "user", "content": a.opening}}
	}
	body, _ := json.Marshal(map[string]any{"model": "m-1", "max_tokens": 64, "messages": a.msgs, "stream": a.stream})
	path := "/v1/chat/completions"
	if a.anthropic {
		path = "/v1/messages"
	}
	req, _ := http.NewRequest(http.MethodPost, a.route+path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-test")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatalf("model call %d: %v", i, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	c := llmCall{status: resp.StatusCode, raw: string(raw), replay: resp.Header.Get("X-Turnsnap-Journal") == "replay", hdr: resp.Header}
	if resp.StatusCode != http.StatusOK {
		return c
	}
	c.text = replyText.FindString(c.raw)
	if c.text == "" {
		a.t.Fatalf("model call %d: no reply text in %q", i, raw)
	}
	a.msgs = append(a.msgs, map[string]string{"role": "assistant", "content": c.text},
		map[string]string{"role": "user", "content": fmt.Sprintf("tool %d said ok", i)})
	return c
}

// llmStatus is GET /v1/llm of the daemon d.
func llmStatus(t *testing.T, d *daemonProc) *api.LLMStatus {
	t.Helper()
	st, err := d.client(t).LLMStatus(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// routeOf is sandbox's route on the daemon's proxy.
func routeOf(t *testing.T, st *api.LLMStatus, name string) string {
	t.Helper()
	for _, s := range st.Sandboxes {
		if s.Name == name && s.Route != "" {
			return s.Route
		}
	}
	t.Fatalf("no route for sandbox %s in %+v", name, st)
	return ""
}

// modelTurns returns sandbox's checkpoints with a conversation hash, by
// turn.
func modelTurns(t *testing.T, d *daemonProc, name string) map[int]api.LogEntry {
	t.Helper()
	log, err := d.client(t).Log(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]api.LogEntry{}
	for _, l := range log {
		if l.Conv != nil && l.OnHead {
			out[l.Turn] = l
		}
	}
	return out
}
