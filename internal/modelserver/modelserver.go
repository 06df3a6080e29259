// Package modelserver is a scripted model for tests that run real coding
// agents (Claude Code, Codex CLI) unmodified. It speaks the Anthropic
// Messages API and the OpenAI Responses and Chat Completions APIs, streamed
// (SSE) and not, faithfully enough that the real CLIs accept its replies,
// and answers each model call with a step of a script: a tool call (a shell
// command, a file write, an edit, a read) or a final text.
//
// The step is chosen by the conversation, not by a call counter: step n
// answers the request that already holds n model turns (assistant messages,
// or runs of model items in a Responses input). So a replay of the same
// conversation, after a rollback or by a restarted agent, gets the same
// step, byte for byte: the replies carry no time and no random ids.
//
// Scripts are selected by the URL: /s/{script}/v1/... uses the script
// registered under that name, so two sandboxes (a branch and its origin)
// can follow different scripts through one server. Every request is kept
// (Requests) and can be logged, which is how the tool shapes each CLI
// expects were found.
package modelserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"
)

// Kind is what a step does.
type Kind string

// The step kinds. An agent's own tool names are chosen per protocol (see
// anthropicTool and openaiTool).
const (
	KindBash  Kind = "bash"  // run Command in a shell
	KindWrite Kind = "write" // write Content to Path (a new file)
	KindEdit  Kind = "edit"  // replace Old by New in Path
	KindRead  Kind = "read"  // read Path (Claude Code's Edit wants it read first)
	KindText  Kind = "text"  // the final answer: the agent's turn ends
	KindTool  Kind = "tool"  // call the agent's tool Name with Input as it is (an MCP tool)
)

// Step is one model reply.
type Step struct {
	Kind    Kind
	Command string         // KindBash
	Path    string         // KindWrite, KindEdit, KindRead: absolute
	Content string         // KindWrite
	Old     string         // KindEdit
	New     string         // KindEdit
	Text    string         // KindText
	Name    string         // KindTool
	Input   map[string]any // KindTool
}

// Bash is a shell-command step.
func Bash(cmd string) Step { return Step{Kind: KindBash, Command: cmd} }

// Write is a file-write step.
func Write(path, content string) Step { return Step{Kind: KindWrite, Path: path, Content: content} }

// Edit is a file-edit step.
func Edit(path, old, new string) Step { return Step{Kind: KindEdit, Path: path, Old: old, New: new} }

// Read is a file-read step.
func Read(path string) Step { return Step{Kind: KindRead, Path: path} }

// Tool is a call of the agent's tool name with input, unchanged: a tool
// the agent does not name itself, such as an MCP server's
// (mcp__SERVER__TOOL in Claude Code). Anthropic Messages only.
func Tool(name string, input map[string]any) Step {
	return Step{Kind: KindTool, Name: name, Input: input}
}

// Say is the final text.
func Say(text string) Step { return Step{Kind: KindText, Text: text} }

// Request is one call the server received.
type Request struct {
	Script string
	Method string
	Path   string // without the /s/{script} prefix
	Body   []byte
	Step   int // the step it was answered with; -1 for a side call
	// Start is when the request arrived, End when its reply was written:
	// the gap from one call's End to the next call's Start is the agent's
	// own time (tool runs) plus whatever sits between agent and server.
	Start, End time.Time
}

// Server is a scripted model on 127.0.0.1.
type Server struct {
	URL string // base URL; a script's base is URL + "/s/" + name
	srv *httptest.Server
	log func(format string, args ...any)

	mu       sync.Mutex
	scripts  map[string][]Step
	requests []Request
	onStep   func(script string, step int)
}

// OnStep sets fn to run before a step is answered (nil: nothing), for a
// test that acts at a chosen point of an agent's session (kills the
// daemon between the agent's request and the model's reply, say).
func (s *Server) OnStep(fn func(script string, step int)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onStep = fn
}

// hook runs the OnStep function for a step that is about to be answered.
func (s *Server) hook(script string, step int) {
	s.mu.Lock()
	fn := s.onStep
	s.mu.Unlock()
	if fn != nil {
		fn(script, step)
	}
}

// New starts a server. log, if not nil, gets one line per request (its
// path and body), for finding out what an agent sends.
func New(log func(format string, args ...any)) *Server {
	s := &Server{scripts: map[string][]Step{}, log: log}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL
	return s
}

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

// Script registers steps under name and returns the script's base URL
// (give it as ANTHROPIC_BASE_URL, or + "/v1" as OPENAI_BASE_URL).
func (s *Server) Script(name string, steps ...Step) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.scripts[name] = steps
	return s.URL + "/s/" + name
}

// Requests returns the calls received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// ModelCalls counts the calls answered with a step of script (side calls
// and token counts left out).
func (s *Server) ModelCalls(script string) int {
	n := 0
	for _, r := range s.Requests() {
		if r.Script == script && r.Step >= 0 {
			n++
		}
	}
	return n
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	script, path := "", r.URL.Path
	if rest, ok := strings.CutPrefix(path, "/s/"); ok {
		script, path, _ = strings.Cut(rest, "/")
		path = "/" + path
	}
	s.mu.Lock()
	steps, known := s.scripts[script]
	s.mu.Unlock()
	rec := Request{Script: script, Method: r.Method, Path: path, Body: body, Step: -1, Start: start}
	defer func() {
		rec.End = time.Now()
		s.mu.Lock()
		s.requests = append(s.requests, rec)
		s.mu.Unlock()
		if s.log != nil {
			s.log("modelserver: %s %s script=%q step=%d body=%s", r.Method, r.URL.RequestURI(), script, rec.Step, body)
		}
	}()
	if !known {
		http.Error(w, `{"error":{"type":"not_found_error","message":"no such script"}}`, http.StatusNotFound)
		return
	}
	switch {
	case r.Method == http.MethodGet && strings.HasSuffix(path, "/models"):
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[{"id":"scripted","object":"model","created":0,"owned_by":"turnsnap"}],"models":[]}`)
	case r.Method != http.MethodPost:
		http.Error(w, `{"error":{"message":"method"}}`, http.StatusMethodNotAllowed)
	case strings.HasSuffix(path, "/messages/count_tokens"):
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"input_tokens":%d}`, len(body)/4+1)
	case strings.HasSuffix(path, "/messages"):
		s.anthropic(w, body, script, steps, &rec)
	case strings.HasSuffix(path, "/responses"):
		s.responses(w, body, script, steps, &rec)
	case strings.HasSuffix(path, "/chat/completions"):
		s.chat(w, body, script, steps, &rec)
	default:
		http.Error(w, `{"error":{"type":"not_found_error","message":"no such route"}}`, http.StatusNotFound)
	}
}

// step is steps[n], or a final text past the end.
func step(steps []Step, n int) Step {
	if n < len(steps) {
		return steps[n]
	}
	return Say("done")
}

func jsonString(v any) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
	return strings.TrimSuffix(b.String(), "\n")
}

// sse writes one event and flushes it, so the agent sees a real stream.
func sse(w http.ResponseWriter, event, data string) {
	if event != "" {
		fmt.Fprintf(w, "event: %s\n", event)
	}
	fmt.Fprintf(w, "data: %s\n\n", data)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

// ---- Anthropic Messages ----

type anthropicReq struct {
	Model    string `json:"model"`
	Stream   bool   `json:"stream"`
	Messages []struct {
		Role string `json:"role"`
	} `json:"messages"`
	Tools []struct {
		Name string `json:"name"`
	} `json:"tools"`
}

// anthropicTool is a step as a Claude Code tool call.
func anthropicTool(st Step) (name string, input map[string]any) {
	switch st.Kind {
	case KindBash:
		return "Bash", map[string]any{"command": st.Command, "description": "scripted step"}
	case KindWrite:
		return "Write", map[string]any{"file_path": st.Path, "content": st.Content}
	case KindEdit:
		return "Edit", map[string]any{"file_path": st.Path, "old_string": st.Old, "new_string": st.New}
	case KindRead:
		return "Read", map[string]any{"file_path": st.Path}
	case KindTool:
		return st.Name, st.Input
	}
	return "", nil
}

func (s *Server) anthropic(w http.ResponseWriter, body []byte, script string, steps []Step, rec *Request) {
	var req anthropicReq
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, `{"type":"error","error":{"type":"invalid_request_error","message":"bad json"}}`, http.StatusBadRequest)
		return
	}
	n := 0
	for _, m := range req.Messages {
		if m.Role == "assistant" {
			n++
		}
	}
	// A call without tools is a side call of the agent (a title, a topic
	// check): it gets a short text and does not consume the script.
	st := Say("ok")
	if len(req.Tools) > 0 {
		st, rec.Step = step(steps, n), n
		s.hook(script, n)
	}
	id := fmt.Sprintf("msg_%s_%d", script, n)
	model := req.Model
	usage := map[string]any{"input_tokens": len(body) / 4, "output_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
	var block map[string]any
	stop := "end_turn"
	if name, input := anthropicTool(st); name != "" {
		block = map[string]any{"type": "tool_use", "id": fmt.Sprintf("toolu_%s_%d", script, n), "name": name, "input": input}
		stop = "tool_use"
	} else {
		block = map[string]any{"type": "text", "text": st.Text}
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, jsonString(map[string]any{"id": id, "type": "message", "role": "assistant", "model": model,
			"content": []any{block}, "stop_reason": stop, "stop_sequence": nil, "usage": usage}))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	sse(w, "message_start", jsonString(map[string]any{"type": "message_start", "message": map[string]any{
		"id": id, "type": "message", "role": "assistant", "model": model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": usage}}))
	if block["type"] == "tool_use" {
		start := map[string]any{"type": "tool_use", "id": block["id"], "name": block["name"], "input": map[string]any{}}
		sse(w, "content_block_start", jsonString(map[string]any{"type": "content_block_start", "index": 0, "content_block": start}))
		sse(w, "content_block_delta", jsonString(map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "input_json_delta", "partial_json": jsonString(block["input"])}}))
	} else {
		sse(w, "content_block_start", jsonString(map[string]any{"type": "content_block_start", "index": 0,
			"content_block": map[string]any{"type": "text", "text": ""}}))
		sse(w, "content_block_delta", jsonString(map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "text_delta", "text": st.Text}}))
	}
	sse(w, "content_block_stop", `{"type":"content_block_stop","index":0}`)
	sse(w, "message_delta", jsonString(map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]any{"output_tokens": 10}}))
	sse(w, "message_stop", `{"type":"message_stop"}`)
}

// ---- OpenAI (Responses and Chat Completions) ----

// openaiTool is a step as a call of one of the function tools the request
// declares, or ("", "") when the step is a text or no declared tool fits.
// File steps become shell commands: Codex edits files through its shell
// (or apply_patch, a freeform tool), and the shell reaches every path.
func openaiTool(st Step, tools map[string]bool) (name, args string) {
	cmd := ""
	switch st.Kind {
	case KindBash:
		cmd = st.Command
	case KindWrite:
		cmd = fmt.Sprintf("cat > %s <<'TURNSNAP_EOF'\n%sTURNSNAP_EOF", shellQuote(st.Path), st.Content)
	case KindEdit:
		cmd = fmt.Sprintf("python3 -c 'import sys; p=sys.argv[1]; s=open(p).read(); assert sys.argv[2] in s; open(p,\"w\").write(s.replace(sys.argv[2], sys.argv[3], 1))' %s %s %s",
			shellQuote(st.Path), shellQuote(st.Old), shellQuote(st.New))
	case KindRead:
		cmd = "cat " + shellQuote(st.Path)
	default:
		return "", ""
	}
	// Each Codex release has named its shell tool differently; use the one
	// this request declares.
	switch {
	case tools["shell_command"]:
		return "shell_command", jsonString(map[string]any{"command": cmd})
	case tools["exec_command"]:
		return "exec_command", jsonString(map[string]any{"cmd": cmd})
	case tools["shell"]:
		return "shell", jsonString(map[string]any{"command": []string{"bash", "-lc", cmd}})
	}
	for _, n := range []string{"bash", "Bash"} {
		if tools[n] {
			return n, jsonString(map[string]any{"command": cmd})
		}
	}
	return "", ""
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// toolNames reads the function tools' names in both shapes: Responses
// ({"type":"function","name":...}) and Chat ({"function":{"name":...}}).
func toolNames(raw []json.RawMessage) map[string]bool {
	out := map[string]bool{}
	for _, t := range raw {
		var v struct {
			Name     string `json:"name"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		json.Unmarshal(t, &v)
		if v.Name != "" {
			out[v.Name] = true
		}
		if v.Function.Name != "" {
			out[v.Function.Name] = true
		}
	}
	return out
}

// responsesTurns counts the runs of model-produced items in a Responses
// input: what the daemon's proxy calls the conversation's position.
func responsesTurns(input json.RawMessage) int {
	var items []struct {
		Type string `json:"type"`
		Role string `json:"role"`
	}
	if json.Unmarshal(input, &items) != nil {
		return 0
	}
	n, in := 0, false
	for _, it := range items {
		model := (it.Type == "message" || it.Type == "") && it.Role == "assistant" ||
			it.Type == "reasoning" || strings.HasSuffix(it.Type, "_call")
		if model && !in {
			n++
		}
		in = model
	}
	return n
}

func (s *Server) responses(w http.ResponseWriter, body []byte, script string, steps []Step, rec *Request) {
	var req struct {
		Model  string            `json:"model"`
		Stream bool              `json:"stream"`
		Input  json.RawMessage   `json:"input"`
		Tools  []json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, `{"error":{"message":"bad json"}}`, http.StatusBadRequest)
		return
	}
	n := responsesTurns(req.Input)
	st := Say("ok")
	tools := toolNames(req.Tools)
	if len(tools) > 0 {
		st, rec.Step = step(steps, n), n
		s.hook(script, n)
	}
	respID := fmt.Sprintf("resp_%s_%d", script, n)
	var item map[string]any
	if name, args := openaiTool(st, tools); name != "" {
		item = map[string]any{"type": "function_call", "id": fmt.Sprintf("fc_%s_%d", script, n), "call_id": fmt.Sprintf("call_%s_%d", script, n),
			"name": name, "arguments": args, "status": "completed"}
	} else {
		if st.Kind != KindText {
			st = Say(fmt.Sprintf("scripted step %d (%s) has no tool among %v", n, st.Kind, tools))
		}
		item = map[string]any{"type": "message", "id": fmt.Sprintf("msg_%s_%d", script, n), "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": st.Text, "annotations": []any{}}}}
	}
	usage := map[string]any{"input_tokens": len(body) / 4, "input_tokens_details": map[string]any{"cached_tokens": 0},
		"output_tokens": 10, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": len(body)/4 + 10}
	resp := func(status string, output []any) map[string]any {
		return map[string]any{"id": respID, "object": "response", "created_at": 0, "status": status, "model": req.Model,
			"output": output, "usage": usage}
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, jsonString(resp("completed", []any{item})))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	seq := 0
	ev := func(typ string, fields map[string]any) {
		fields["type"] = typ
		fields["sequence_number"] = seq
		seq++
		sse(w, typ, jsonString(fields))
	}
	ev("response.created", map[string]any{"response": resp("in_progress", []any{})})
	added := map[string]any{}
	for k, v := range item {
		added[k] = v
	}
	added["status"] = "in_progress"
	if item["type"] == "message" {
		added["content"] = []any{}
		ev("response.output_item.added", map[string]any{"output_index": 0, "item": added})
		ev("response.content_part.added", map[string]any{"item_id": item["id"], "output_index": 0, "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
		ev("response.output_text.delta", map[string]any{"item_id": item["id"], "output_index": 0, "content_index": 0, "delta": st.Text})
		ev("response.output_text.done", map[string]any{"item_id": item["id"], "output_index": 0, "content_index": 0, "text": st.Text})
		ev("response.content_part.done", map[string]any{"item_id": item["id"], "output_index": 0, "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": st.Text, "annotations": []any{}}})
	} else {
		added["arguments"] = ""
		ev("response.output_item.added", map[string]any{"output_index": 0, "item": added})
		ev("response.function_call_arguments.delta", map[string]any{"item_id": item["id"], "output_index": 0, "delta": item["arguments"]})
		ev("response.function_call_arguments.done", map[string]any{"item_id": item["id"], "output_index": 0, "arguments": item["arguments"]})
	}
	ev("response.output_item.done", map[string]any{"output_index": 0, "item": item})
	ev("response.completed", map[string]any{"response": resp("completed", []any{item})})
}

func (s *Server) chat(w http.ResponseWriter, body []byte, script string, steps []Step, rec *Request) {
	var req struct {
		Model    string `json:"model"`
		Stream   bool   `json:"stream"`
		Messages []struct {
			Role string `json:"role"`
		} `json:"messages"`
		Tools []json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, `{"error":{"message":"bad json"}}`, http.StatusBadRequest)
		return
	}
	n := 0
	for _, m := range req.Messages {
		if m.Role == "assistant" {
			n++
		}
	}
	st := Say("ok")
	tools := toolNames(req.Tools)
	if len(tools) > 0 {
		st, rec.Step = step(steps, n), n
		s.hook(script, n)
	}
	id := fmt.Sprintf("chatcmpl_%s_%d", script, n)
	msg := map[string]any{"role": "assistant", "content": nil}
	finish := "stop"
	var call map[string]any
	if name, args := openaiTool(st, tools); name != "" {
		call = map[string]any{"id": fmt.Sprintf("call_%s_%d", script, n), "type": "function", "function": map[string]any{"name": name, "arguments": args}}
		msg["tool_calls"] = []any{call}
		finish = "tool_calls"
	} else {
		msg["content"] = st.Text
	}
	usage := map[string]any{"prompt_tokens": len(body) / 4, "completion_tokens": 10, "total_tokens": len(body)/4 + 10}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, jsonString(map[string]any{"id": id, "object": "chat.completion", "created": 0, "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}}, "usage": usage}))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	chunk := func(delta map[string]any, finish any) {
		sse(w, "", jsonString(map[string]any{"id": id, "object": "chat.completion.chunk", "created": 0, "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}))
	}
	chunk(map[string]any{"role": "assistant", "content": ""}, nil)
	if call != nil {
		call["index"] = 0
		chunk(map[string]any{"tool_calls": []any{call}}, nil)
	} else {
		chunk(map[string]any{"content": st.Text}, nil)
	}
	chunk(map[string]any{}, finish)
	sse(w, "", "[DONE]")
}
