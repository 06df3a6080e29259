package llmproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// agent is an unmodified agent's model loop: it sends its conversation,
// appends the model's reply and a tool result, and goes on.
type agent struct {
	t       *testing.T
	url     string
	stream  bool
	opening string
	replies []string // the assistant messages so far
}

type call struct {
	reply   string
	raw     string // the reply body exactly as received
	journal bool   // answered from the journal
}

func (a *agent) step() call {
	a.t.Helper()
	msgs := []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": a.opening}}
	for i, r := range a.replies {
		msgs = append(msgs, map[string]any{"role": "assistant", "content": r},
			map[string]any{"role": "user", "content": fmt.Sprintf("tool result %d", i)})
	}
	body, _ := json.Marshal(map[string]any{"model": "gpt-test", "messages": msgs, "stream": a.stream})
	resp, err := http.Post(a.url, "application/json", bytes.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		a.t.Fatalf("model call: %d %v %s", resp.StatusCode, err, raw)
	}
	c := call{raw: string(raw), journal: resp.Header.Get("X-Turnsnap-Journal") == "replay"}
	if a.stream {
		for _, l := range strings.Split(c.raw, "\n") {
			var chunk struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
			}
			if d, ok := strings.CutPrefix(l, "data: "); ok && d != "[DONE]" && json.Unmarshal([]byte(d), &chunk) == nil && len(chunk.Choices) > 0 {
				c.reply += chunk.Choices[0].Delta.Content
			}
		}
	} else {
		var out struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(raw, &out); err != nil || len(out.Choices) == 0 {
			a.t.Fatalf("reply %q: %v", raw, err)
		}
		c.reply = out.Choices[0].Message.Content
	}
	a.replies = append(a.replies, c.reply)
	return c
}

// After a rollback to the checkpoint of turn 2, an agent that restarts and
// replays its conversation from the beginning gets the two replies that
// state already acted on from the journal, byte for byte and without a model
// call, and live replies from then on. A conversation that differs never
// matches.
func TestReplayAfterRollback(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			ctx := context.Background()
			up := newStub(t)
			j := newJournal(t)
			turns := &fakeTurns{journal: j}
			_, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: turns, Journal: j})
			url := base + "/llm/agent1/v1/chat/completions"

			first := &agent{t: t, url: url, stream: stream, opening: "fix the bug"}
			var orig []call
			for i := 0; i < 4; i++ {
				c := first.step()
				if c.journal {
					t.Fatalf("call %d answered from an empty journal", i)
				}
				orig = append(orig, c)
			}
			refs := turns.refs["agent1"][2]
			if len(refs) != 2 {
				t.Fatalf("checkpoint of turn 2 references %d journal entries, want 2", len(refs))
			}
			// The daemon's rollback to turn 2 resets the journal to what that
			// checkpoint references.
			if err := j.Reset(ctx, "agent1", refs); err != nil {
				t.Fatal(err)
			}
			checkpoints := len(turns.seen())

			again := &agent{t: t, url: url, stream: stream, opening: "fix the bug"}
			for i := 0; i < 4; i++ {
				c := again.step()
				if want := i < 2; c.journal != want {
					t.Fatalf("replayed call %d: from journal %v, want %v", i, c.journal, want)
				}
				if i < 2 && c.raw != orig[i].raw {
					t.Fatalf("replayed call %d: %q, want the original %q", i, c.raw, orig[i].raw)
				}
				if i >= 2 && c.reply == orig[i].reply {
					t.Fatalf("call %d after the restored turn got the old reply %q", i, c.reply)
				}
			}
			if n := up.calls.Load(); n != 6 {
				t.Fatalf("upstream answered %d calls, want 4 + 2 live after the replay", n)
			}
			if n := len(turns.seen()) - checkpoints; n != 2 {
				t.Fatalf("%d checkpoints during the replay, want 2 (journal answers take none)", n)
			}
			other := &agent{t: t, url: url, stream: stream, opening: "something else"}
			if c := other.step(); c.journal {
				t.Fatal("a different conversation was answered from the journal")
			}
			// Same conversation, other form: a streamed journal entry never
			// answers a non-streamed call.
			flipped := &agent{t: t, url: url, stream: !stream, opening: "fix the bug"}
			if c := flipped.step(); c.journal {
				t.Fatal("the journal answered a call asking for the other reply form")
			}
		})
	}
}

// memObjects is an in-memory object store for the journal's unit tests.
type memObjects struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (s *memObjects) Put(_ context.Context, name string, r io.Reader, _ int64) error {
	b, err := io.ReadAll(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[name] = b
	return err
}

func (s *memObjects) Get(_ context.Context, name string) (io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[name]
	if !ok {
		return nil, fmt.Errorf("object %s: %w", name, errdefs.ErrNotFound)
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func TestJournalRoundTripAndCorruption(t *testing.T) {
	ctx := context.Background()
	st := &memObjects{m: map[string][]byte{}}
	j, err := NewStoreJournal(st)
	if err != nil {
		t.Fatal(err)
	}
	e := &Entry{Conv: delta.Hash([]byte("c")), Turn: 3, Shape: ShapeMessages, Stream: true, Status: 200,
		ContentType: "text/event-stream", Request: []byte(`{"a":1}`), Response: bytes.Repeat([]byte("data: x\n\n"), 1000)}
	if err := j.Put(ctx, "s1", e); err != nil {
		t.Fatal(err)
	}
	got, err := j.Get(ctx, "s1", e.Conv)
	if err != nil || got == nil || !bytes.Equal(got.Response, e.Response) || got.Turn != 3 || !got.Stream || got.ContentType != e.ContentType {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if got, err := j.Get(ctx, "s2", e.Conv); got != nil || err != nil {
		t.Fatalf("another sandbox's journal answered: %v %v", got, err)
	}
	refs := j.Refs("s1")
	name := JournalName(refs[0])
	if len(st.m[name]) >= len(e.Response) {
		t.Errorf("entry stored in %d bytes: not compressed", len(st.m[name]))
	}
	// Content-addressed: the same entry in a branch is the same object.
	if err := j.Put(ctx, "s2", e); err != nil || len(st.m) != 1 {
		t.Fatalf("second put: %v, %d objects", err, len(st.m))
	}
	// A flipped byte is corruption, named, never a reply.
	good := bytes.Clone(st.m[name])
	for _, bad := range [][]byte{flip(good, len(good)/2), good[:len(good)/2], []byte("garbage")} {
		st.m[name] = bad
		if _, err := j.Get(ctx, "s1", e.Conv); !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), refs[0].Short()) {
			t.Fatalf("corrupt entry: %v, want ErrCorrupt naming %s", err, refs[0].Short())
		}
	}
	// Reset to a missing entry fails and leaves the journal as it was.
	st.m[name] = good
	if err := j.Reset(ctx, "s1", []delta.ID{delta.Hash([]byte("missing"))}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("reset to a missing entry: %v", err)
	}
	if got, _ := j.Get(ctx, "s1", e.Conv); got == nil {
		t.Fatal("a failed reset changed the journal")
	}
	if err := j.Reset(ctx, "s1", nil); err != nil || len(j.Refs("s1")) != 0 {
		t.Fatalf("reset to nothing: %v, %d refs", err, len(j.Refs("s1")))
	}
}

func flip(b []byte, i int) []byte {
	c := bytes.Clone(b)
	c[i] ^= 0x40
	return c
}

func TestDecodeEntryBounds(t *testing.T) {
	e := &Entry{Shape: ShapeChat, Status: 200, Request: []byte("req"), Response: []byte("resp")}
	b, err := encodeEntry(e)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := decodeEntry(b); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(b); i++ {
		if _, err := decodeEntry(b[:i]); !errors.Is(err, errdefs.ErrCorrupt) {
			t.Fatalf("entry cut at %d: %v", i, err)
		}
	}
	if _, err := encodeEntry(&Entry{Shape: ShapeChat, Status: 200, Response: make([]byte, MaxEntry)}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("oversized entry: %v", err)
	}
}

// brokenObjects fails every write and serves garbage for every read.
type brokenObjects struct{ memObjects }

func (b *brokenObjects) Put(context.Context, string, io.Reader, int64) error {
	return fmt.Errorf("disk full: %w", errdefs.ErrUnavailable)
}

// A journal that cannot be written or read never costs the agent its reply:
// the failure is counted and the model answers live.
func TestJournalFailuresNeverBreakReplies(t *testing.T) {
	up := newStub(t)
	st := &brokenObjects{memObjects{m: map[string][]byte{}}}
	j, err := NewStoreJournal(st)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	_, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: &fakeTurns{}, Journal: j, Registerer: reg})
	url := base + "/llm/agent1/v1/chat/completions"
	if s, _, b := post(t, url, chat(false), nil); s != 200 || !strings.Contains(b, "live #1") {
		t.Fatalf("reply with an unwritable journal: %d %s", s, b)
	}
	if n := counter(t, reg, "turnsnap_llm_journal_errors_total", "put"); n != 1 {
		t.Fatalf("%v journal write errors counted, want 1", n)
	}
	// An index entry whose object is garbage: the read fails, the model answers.
	r, _ := ParseRequest(ShapeChat, []byte(chat(false, "x")))
	id := delta.Hash([]byte("entry"))
	st.m[JournalName(id)] = []byte("garbage")
	j.idx["agent1"] = map[delta.ID]journalRef{r.Conv: {obj: id}}
	j.arm("agent1", []delta.ID{r.Conv}) // as a restore would
	if s, h, b := post(t, url, chat(false, "x"), nil); s != 200 || h.Get("X-Turnsnap-Journal") != "" || !strings.Contains(b, "live #2") {
		t.Fatalf("reply with a corrupt journal entry: %d %s", s, b)
	}
	if n := counter(t, reg, "turnsnap_llm_journal_errors_total", "get"); n != 1 {
		t.Fatalf("%v journal read errors counted, want 1", n)
	}
}

// A reply larger than MaxJournal reaches the agent whole and is not
// journaled.
func TestOversizedReplyNotJournaled(t *testing.T) {
	up := newStub(t)
	j := newJournal(t)
	_, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: &fakeTurns{}, Journal: j, MaxJournal: 100})
	for _, stream := range []bool{false, true} {
		s, _, b := post(t, base+"/llm/agent1/v1/chat/completions", chat(stream), nil)
		if s != 200 || !strings.Contains(b, "#") || len(b) <= 100 {
			t.Fatalf("stream=%v: %d %q", stream, s, b)
		}
	}
	if refs := j.Refs("agent1"); len(refs) != 0 {
		t.Fatalf("%d oversized replies journaled", len(refs))
	}
}
