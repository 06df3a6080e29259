package llmproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func TestTurnPosition(t *testing.T) {
	cases := []struct {
		shape Shape
		body  string
		turn  int
	}{
		{ShapeChat, `{"model":"m","messages":[{"role":"user","content":"a"}]}`, 0},
		{ShapeChat, `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"a"},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"1","content":"r"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}`, 2},
		{ShapeMessages, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"text","text":"b"}]},{"role":"user","content":"c"}]}`, 1},
		{ShapeResponses, `{"model":"m","input":"hello"}`, 0},
		// One model turn emitting reasoning, a message and two calls is one
		// turn; the tool outputs end it.
		{ShapeResponses, `{"model":"m","input":[{"role":"user","content":"a"},{"type":"reasoning","id":"r","summary":[]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"x"}]},{"type":"function_call","call_id":"1","name":"f","arguments":"{}"},{"type":"function_call","call_id":"2","name":"g","arguments":"{}"},{"type":"function_call_output","call_id":"1","output":"o"},{"type":"function_call_output","call_id":"2","output":"o"},{"type":"function_call","call_id":"3","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"3","output":"o"}]}`, 2},
		{ShapeResponses, `{"model":"m","previous_response_id":"resp_1","input":[{"type":"function_call_output","call_id":"1","output":"o"}]}`, -1},
		{ShapeCompletions, `{"model":"m","prompt":"once upon"}`, -1},
	}
	for _, c := range cases {
		r, err := ParseRequest(c.shape, []byte(c.body))
		if err != nil || r.Turn != c.turn {
			t.Errorf("%s %s: turn %d (%v), want %d", c.shape, c.body, r.Turn, err, c.turn)
		}
	}
}

// The conversation hash ignores how the request was serialised and what is
// not conversation; it changes with anything the model sees.
func TestConversationHash(t *testing.T) {
	base := `{"model":"m","stream":false,"temperature":0.2,"messages":[{"role":"user","content":"héllo <b>"},{"role":"assistant","content":"x","refusal":null}]}`
	h := func(shape Shape, body string) string {
		t.Helper()
		r, err := ParseRequest(shape, []byte(body))
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		return r.Conv.String()
	}
	want := h(ShapeChat, base)
	same := []string{
		`{ "messages" : [ {"content":"h\u00e9llo \u003cb>","role":"user"}, {"role":"assistant","content":"x"} ], "model":"m" }`,
		`{"model":"m","stream":true,"temperature":1,"metadata":{"user_id":"session-42"},"messages":[{"role":"user","content":"héllo <b>"},{"role":"assistant","content":"x"}]}`,
		`{"model":"m","tools":null,"messages":[{"role":"user","content":"héllo <b>"},{"role":"assistant","content":"x"}]}`,
	}
	for _, s := range same {
		if got := h(ShapeChat, s); got != want {
			t.Errorf("%s hashes %s, want %s (same conversation)", s, got[:12], want[:12])
		}
	}
	differ := map[string]string{
		"content": `{"model":"m","messages":[{"role":"user","content":"hello <b>"},{"role":"assistant","content":"x"}]}`,
		"model":   `{"model":"m2","messages":[{"role":"user","content":"héllo <b>"},{"role":"assistant","content":"x"}]}`,
		"tools":   `{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"héllo <b>"},{"role":"assistant","content":"x"}]}`,
		"prefix":  `{"model":"m","messages":[{"role":"user","content":"héllo <b>"}]}`,
		"number":  `{"model":"m","messages":[{"role":"user","content":"héllo <b>"},{"role":"assistant","content":"x","n":1.0}]}`,
	}
	seen := map[string]string{want: "base"}
	for name, s := range differ {
		got := h(ShapeChat, s)
		if prev, dup := seen[got]; dup {
			t.Errorf("%s hashes like %s", name, prev)
		}
		seen[got] = name
	}
	if h(ShapeMessages, base) == want {
		t.Error("the same fields in another API shape hash equal")
	}
}

func TestParseRejects(t *testing.T) {
	for _, body := range []string{``, `null`, `[]`, `"x"`, `{"model":"m"} {}`, `{"model":`, `{"a":1}x`} {
		if _, err := ParseRequest(ShapeChat, []byte(body)); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%q: %v, want ErrInvalid", body, err)
		}
	}
}

// FuzzParseRequest: parsing never panics, and a request re-serialised
// differently (keys reordered, indented) has the same turn and hash.
func FuzzParseRequest(f *testing.F) {
	f.Add(0, []byte(chat(false, "a", "b")))
	f.Add(1, []byte(`{"model":"m","input":[{"role":"user","content":"a"},{"type":"reasoning"},{"type":"function_call","name":"f"},{"type":"function_call_output","output":"o"}]}`))
	f.Add(2, []byte(`{"model":"m","prompt":["a","b"],"suffix":null}`))
	f.Add(3, []byte(`{"model":"m","system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"\u2028é\"\\"}]},{"role":"assistant","content":"1e400"}]}`))
	shapes := []Shape{ShapeChat, ShapeResponses, ShapeCompletions, ShapeMessages}
	f.Fuzz(func(t *testing.T, s int, body []byte) {
		shape := shapes[uint(s)%uint(len(shapes))]
		r, err := ParseRequest(shape, body)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("error of the wrong class: %v", err)
			}
			return
		}
		if r.Turn < -1 {
			t.Fatalf("turn %d", r.Turn)
		}
		top, err := decodeObject(body)
		if err != nil {
			t.Fatal(err)
		}
		again, err := json.Marshal(top) // sorted keys, other escaping
		if err != nil {
			return // a number json cannot re-encode; nothing to compare
		}
		var ind bytes.Buffer
		if err := json.Indent(&ind, again, "", "  "); err != nil {
			t.Fatal(err)
		}
		r2, err := ParseRequest(shape, ind.Bytes())
		if err != nil || r2.Conv != r.Conv || r2.Turn != r.Turn || r2.Stream != r.Stream {
			t.Fatalf("re-serialised request parses to %+v (%v), want %+v", r2, err, r)
		}
		// The canonical form of every conversation field is valid JSON.
		for _, fld := range convFields[shape] {
			if v, ok := top[fld]; ok {
				c, err := canonical(v)
				if err != nil || !json.Valid(c) {
					t.Fatalf("canonical %s = %q (%v)", fld, c, err)
				}
			}
		}
	})
}

// FuzzDecodeEntry: a journal entry's decoder never panics, never reads past
// a declared length, and what it accepts re-encodes to the same bytes.
func FuzzDecodeEntry(f *testing.F) {
	good, _ := encodeEntry(&Entry{Shape: ShapeChat, Status: 200, ContentType: "application/json", Request: []byte("{}"), Response: []byte(`{"ok":1}`)})
	f.Add(good)
	f.Add([]byte("TSJ1\x02{}\x00\x00"))
	d, _ := encodeDelta(&Entry{Turn: 2, Shape: ShapeChat, Status: 200, Request: []byte(`{"a":[1,2]}`)}, journalFileName(delta.ID{}, 1), []byte(`{"a":[1]}`))
	f.Add(d)
	f.Add([]byte("TSJ1\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		// The delta-aware decoder accepts only deltas that name an earlier
		// turn's entry, with sane lengths and a request hash.
		if h, _, _, err := decodeParts(b); err == nil && h.Base != "" {
			if _, bt, ok := parseJournalFileName(h.Base); !ok || bt >= h.Turn || h.Prefix < 0 || h.Suffix < 0 || h.Req == nil {
				t.Fatalf("accepted delta header %+v", h)
			}
		} else if err != nil && !errors.Is(err, errdefs.ErrCorrupt) {
			t.Fatalf("error of the wrong class: %v", err)
		}
		e, err := decodeEntry(b)
		if err != nil {
			if !errors.Is(err, errdefs.ErrCorrupt) {
				t.Fatalf("error of the wrong class: %v", err)
			}
			return
		}
		again, err := encodeEntry(e)
		if err != nil {
			t.Fatal(err)
		}
		e2, err := decodeEntry(again)
		if err != nil || !slices.Equal(e2.Request, e.Request) || !slices.Equal(e2.Response, e.Response) || e2.Status != e.Status || e2.Conv != e.Conv {
			t.Fatalf("re-encoded entry decodes to %+v (%v)", e2, err)
		}
	})
}

func TestAgentEnv(t *testing.T) {
	env, err := AgentEnv([]string{"PATH=/bin", "OPENAI_BASE_URL=https://api.openai.com/v1", "OPENAI_API_KEY=sk-1", "X=a=b"}, "http://127.0.0.1:7070/", "agent1")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"PATH=/bin", "OPENAI_API_KEY=sk-1", "X=a=b",
		"OPENAI_BASE_URL=http://127.0.0.1:7070/llm/agent1/v1", "OPENAI_API_BASE=http://127.0.0.1:7070/llm/agent1/v1",
		"ANTHROPIC_BASE_URL=http://127.0.0.1:7070/llm/agent1", "TURNSNAP_SANDBOX=agent1", "TURNSNAP_LLM_URL=http://127.0.0.1:7070/llm/agent1"}
	if !slices.Equal(env, want) {
		t.Fatalf("env\n%s\nwant\n%s", strings.Join(env, "\n"), strings.Join(want, "\n"))
	}
	for _, bad := range [][2]string{{"127.0.0.1:7070", "a"}, {"http://127.0.0.1:7070", "../x"}, {"http://127.0.0.1:7070", ""}} {
		if _, err := AgentEnv(nil, bad[0], bad[1]); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("AgentEnv(%q, %q): %v, want ErrInvalid", bad[0], bad[1], err)
		}
	}
}

// The SDKs, given the environment, reach the proxy's routes: the OpenAI
// SDK appends /chat/completions to OPENAI_BASE_URL, the Anthropic SDK
// /v1/messages to ANTHROPIC_BASE_URL.
func TestAgentEnvRoutesReachTheProxy(t *testing.T) {
	up := newStub(t)
	turns := &fakeTurns{}
	_, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: turns})
	env, err := AgentEnv(nil, base, "agent1")
	if err != nil {
		t.Fatal(err)
	}
	get := func(k string) string {
		for _, kv := range env {
			if v, ok := strings.CutPrefix(kv, k+"="); ok {
				return v
			}
		}
		return ""
	}
	if s, _, b := post(t, get("OPENAI_BASE_URL")+"/chat/completions", chat(false), nil); s != 200 {
		t.Fatalf("openai route: %d %s", s, b)
	}
	if s, _, b := post(t, get("ANTHROPIC_BASE_URL")+"/v1/messages", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"a"}]}`, nil); s != 200 {
		t.Fatalf("anthropic route: %d %s", s, b)
	}
	if n := len(turns.seen()); n != 2 {
		t.Fatalf("%d turns, want 2", n)
	}
}

// FuzzCanonMatchesReference holds the single-pass parser to the reference
// (decode into any, re-encode): the same verdict on every body, and for
// accepted ones the same hash, position and stream flag; on any JSON value,
// the same canonical bytes.
func FuzzCanonMatchesReference(f *testing.F) {
	for _, s := range []string{chat(true, "a", "b"), `{"a":1,"a":null}`, `{"model":"m","messages":[{"role":"assistant","role":"user"},{"role":null}]}`,
		`{"input":[{"type":"reasoning"},{"type":1},[],{"role":"assistant","type":"message"}],"model":"\u00e9\ud800"}`,
		"{\"messages\":[\"\xff\xfe\"],\"model\":\"\xe2\x80\xa8\"}", `{"stream":true,"stream":1}`, `[1, 2.5e-3, -0, "x"]`, `{"x":{"b":[],"a":{}}}  `} {
		f.Add(0, []byte(s))
		f.Add(1, []byte(s))
		f.Add(3, []byte(s))
	}
	shapes := []Shape{ShapeChat, ShapeResponses, ShapeCompletions, ShapeMessages}
	f.Fuzz(func(t *testing.T, s int, body []byte) {
		shape := shapes[uint(s)%uint(len(shapes))]
		fast, ferr := ParseRequest(shape, body)
		ref, rerr := parseReference(shape, body)
		if (ferr == nil) != (rerr == nil) {
			t.Fatalf("fast parser error %v, reference error %v", ferr, rerr)
		}
		if ferr == nil && fast != ref {
			t.Fatalf("fast parser %+v, reference %+v", fast, ref)
		}
		// Any JSON value, not only objects.
		p := &canonParser{b: body}
		perr := p.value()
		if perr == nil {
			p.ws()
			if p.i != len(body) {
				perr = errSyntax
			}
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		var v any
		derr := dec.Decode(&v)
		if derr == nil {
			if _, err := dec.Token(); err != io.EOF {
				derr = errSyntax
			}
		}
		if (perr == nil) != (derr == nil) {
			t.Fatalf("canonical parser error %v, encoding/json error %v", perr, derr)
		}
		if perr == nil {
			want, err := canonical(v)
			if err != nil || !bytes.Equal(p.out, want) {
				t.Fatalf("canonical form %q, reference %q", p.out, want)
			}
		}
	})
}
