package modelserver

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func post(t *testing.T, url, body string) (string, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, b)
	}
	return resp.Header.Get("Content-Type"), string(b)
}

// sseData is the data lines of an SSE stream, each decoded.
func sseData(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || d == "[DONE]" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(d), &m); err != nil {
			t.Fatalf("SSE data %q: %v", d, err)
		}
		out = append(out, m)
	}
	return out
}

// Each protocol, streamed and not: the step follows the conversation (the
// assistant turns it holds), a replay of the same conversation gets the
// same bytes, a call without tools does not consume the script, and file
// steps become the tools each agent declares.
func TestProtocols(t *testing.T) {
	s := New(t.Logf)
	defer s.Close()
	base := s.Script("x", Bash("make test"), Write("/p/f.txt", "hi\n"), Say("finished"))

	// Anthropic, not streamed: step 0 is a Bash tool_use.
	tools := `"tools":[{"name":"Bash"},{"name":"Write"}]`
	req0 := `{"model":"m","max_tokens":5,` + tools + `,"messages":[{"role":"user","content":"go"}]}`
	_, b0 := post(t, base+"/v1/messages?beta=true", req0)
	var m struct {
		Content []struct {
			Type, Name string
			Input      map[string]any
		}
		StopReason string `json:"stop_reason"`
	}
	json.Unmarshal([]byte(b0), &m)
	if len(m.Content) != 1 || m.Content[0].Type != "tool_use" || m.Content[0].Name != "Bash" || m.Content[0].Input["command"] != "make test" || m.StopReason != "tool_use" {
		t.Fatalf("anthropic step 0: %s", b0)
	}
	if _, again := post(t, base+"/v1/messages", req0); again != b0 {
		t.Fatalf("a replay got %s, want %s", again, b0)
	}
	// Streamed, one assistant turn in: step 1, Write, as input_json_delta.
	req1 := `{"model":"m","stream":true,` + tools + `,"messages":[{"role":"user","content":"go"},{"role":"assistant","content":"x"},{"role":"user","content":"ok"}]}`
	ct, b1 := post(t, base+"/v1/messages?beta=true", req1)
	evs := sseData(t, b1)
	if ct != "text/event-stream" || len(evs) != 6 || evs[0]["type"] != "message_start" || evs[5]["type"] != "message_stop" {
		t.Fatalf("anthropic stream: %s %s", ct, b1)
	}
	var in map[string]any
	json.Unmarshal([]byte(evs[2]["delta"].(map[string]any)["partial_json"].(string)), &in)
	if evs[1]["content_block"].(map[string]any)["name"] != "Write" || in["file_path"] != "/p/f.txt" || in["content"] != "hi\n" {
		t.Fatalf("anthropic step 1: %s", b1)
	}
	// A side call (no tools) gets text and is no step.
	_, side := post(t, base+"/v1/messages", `{"model":"m","messages":[{"role":"user","content":"title?"}]}`)
	if !strings.Contains(side, `"text":"ok"`) {
		t.Fatalf("side call: %s", side)
	}

	// Responses: Codex's exec_command; a Write becomes a shell command.
	rtools := `"tools":[{"type":"function","name":"exec_command"}]`
	_, r0 := post(t, base+"/v1/responses", `{"model":"m",`+rtools+`,"input":[{"type":"message","role":"user","content":"go"}]}`)
	var rr struct {
		Output []struct{ Type, Name, Arguments string }
	}
	json.Unmarshal([]byte(r0), &rr)
	if len(rr.Output) != 1 || rr.Output[0].Type != "function_call" || rr.Output[0].Name != "exec_command" || rr.Output[0].Arguments != `{"cmd":"make test"}` {
		t.Fatalf("responses step 0: %s", r0)
	}
	_, r1 := post(t, base+"/v1/responses", `{"model":"m","stream":true,`+rtools+`,"input":[{"type":"message","role":"user","content":"go"},`+
		`{"type":"reasoning"},{"type":"function_call","call_id":"c"},{"type":"function_call_output","call_id":"c","output":"ok"}]}`)
	evs = sseData(t, r1)
	last := evs[len(evs)-1]
	item := last["response"].(map[string]any)["output"].([]any)[0].(map[string]any)
	if last["type"] != "response.completed" || !strings.Contains(item["arguments"].(string), `cat > '/p/f.txt'`) {
		t.Fatalf("responses step 1: %s", r1)
	}
	// Chat Completions, streamed: two assistant turns in: the final text.
	_, c2 := post(t, base+"/v1/chat/completions", `{"model":"m","stream":true,"tools":[{"type":"function","function":{"name":"shell"}}],`+
		`"messages":[{"role":"user","content":"go"},{"role":"assistant"},{"role":"tool"},{"role":"assistant"},{"role":"tool"}]}`)
	if !strings.Contains(c2, `"content":"finished"`) || !strings.Contains(c2, `"finish_reason":"stop"`) || !strings.HasSuffix(c2, "data: [DONE]\n\n") {
		t.Fatalf("chat step 2: %s", c2)
	}
	// Not streamed, step 0: a shell tool call.
	_, c0 := post(t, base+"/v1/chat/completions", `{"model":"m","tools":[{"type":"function","function":{"name":"shell"}}],"messages":[{"role":"user","content":"go"}]}`)
	if !bytes.Contains([]byte(c0), []byte(`"arguments":"{\"command\":[\"bash\",\"-lc\",\"make test\"]}"`)) {
		t.Fatalf("chat step 0: %s", c0)
	}
	if n := s.ModelCalls("x"); n != 7 {
		t.Fatalf("ModelCalls = %d, want 7 (the side call left out)", n)
	}
	// An unknown script is a 404, before anything is answered.
	resp, err := http.Post(s.URL+"/s/nosuch/v1/messages", "application/json", strings.NewReader(req0))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown script: %d", resp.StatusCode)
	}
}

// A Tool step calls the named tool with its input unchanged (an MCP
// server's tool, as Claude Code names it).
func TestToolStep(t *testing.T) {
	s := New(t.Logf)
	defer s.Close()
	base := s.Script("t", Tool("mcp__turnsnap__rollback", map[string]any{"checkpoint": "HEAD~1"}))
	_, b := post(t, base+"/v1/messages", `{"model":"m","tools":[{"name":"mcp__turnsnap__rollback"}],"messages":[{"role":"user","content":"go"}]}`)
	var m struct {
		Content []struct {
			Type  string
			Name  string
			Input map[string]any
		}
		StopReason string `json:"stop_reason"`
	}
	if err := json.Unmarshal([]byte(b), &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Content) != 1 || m.Content[0].Type != "tool_use" || m.Content[0].Name != "mcp__turnsnap__rollback" ||
		m.Content[0].Input["checkpoint"] != "HEAD~1" || m.StopReason != "tool_use" {
		t.Fatalf("reply %s", b)
	}
}
