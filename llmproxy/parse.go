package llmproxy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Shape is the API a model request speaks; it decides where the
// conversation lives in the request body.
type Shape string

const (
	ShapeChat        Shape = "openai-chat"        // POST .../chat/completions
	ShapeResponses   Shape = "openai-responses"   // POST .../responses
	ShapeCompletions Shape = "openai-completions" // POST .../completions (legacy, prompt only)
	ShapeMessages    Shape = "anthropic-messages" // POST .../messages
)

// shapeOf names the shape of a model call by its path's last segments, so
// that upstreams mounted under a prefix (/api/v1/chat/completions,
// /openai/deployments/x/chat/completions) are recognised too. Sub-resources
// such as /v1/messages/count_tokens or /v1/responses/{id} do not match: they
// are not model calls.
func shapeOf(path string) (Shape, bool) {
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return ShapeChat, true
	case strings.HasSuffix(path, "/responses"):
		return ShapeResponses, true
	case strings.HasSuffix(path, "/completions"):
		return ShapeCompletions, true
	case strings.HasSuffix(path, "/messages"):
		return ShapeMessages, true
	}
	return "", false
}

// convFields lists, per shape, the request fields that make up the
// conversation: what the model sees and what decides which reply is valid.
// Sampling knobs, metadata (Claude Code puts a per-session id there) and
// the stream flag are left out, so a restarted agent that replays the same
// conversation hashes the same. The order is part of the hash.
var convFields = map[Shape][]string{
	ShapeChat:        {"model", "messages", "tools", "functions"},
	ShapeResponses:   {"model", "instructions", "input", "tools", "previous_response_id"},
	ShapeCompletions: {"model", "prompt", "suffix"},
	ShapeMessages:    {"model", "system", "messages", "tools"},
}

// convDomain separates conversation hashes from every other BLAKE3 use.
const convDomain = "turnsnap-llm-conversation-v1\n"

// Request is what the proxy reads from a model call's body.
type Request struct {
	Shape Shape
	// Turn is the conversation's position: the assistant turns it already
	// holds (0 for an agent's first call). -1 when the body does not say:
	// a legacy completion, or a Responses call chained with
	// previous_response_id whose history lives upstream.
	Turn int
	// Conv is the conversation hash: BLAKE3 over the canonical JSON of the
	// conversation fields (convFields), null members dropped, object keys
	// sorted. Equal conversations hash equal however they were serialised.
	Conv delta.ID
	// Stream says the agent asked for server-sent events.
	Stream bool
}

// ParseRequest reads a model call's JSON body. The caller bounds the body's
// size; nesting is bounded as in encoding/json. A body that is not a JSON
// object is ErrInvalid: the proxy forwards it untouched and the upstream
// answers it.
func ParseRequest(shape Shape, body []byte) (Request, error) {
	req := Request{Shape: shape, Turn: -1}
	fields, ok := convFields[shape]
	if !ok {
		return req, fmt.Errorf("request shape %q: %w", shape, errdefs.ErrInvalid)
	}
	top, err := parseTop(body, topNames[shape])
	if err != nil {
		return req, fmt.Errorf("%s request body: %w: %v", shape, errdefs.ErrInvalid, err)
	}
	defer top.release()
	req.Stream = top.member("stream").kind == 't'
	// The hashed bytes are written straight into the hasher: no copy of the
	// conversation is assembled.
	h := delta.IDs{}.New() // plain on purpose: a conversation hash is matched across homes, never stored as a content name
	h.WriteString(convDomain)
	h.WriteString(string(shape))
	for _, f := range fields {
		m := top.member(f)
		if !m.present || m.kind == 'n' {
			continue
		}
		h.WriteString("\x00")
		h.WriteString(f)
		h.WriteString("\x00")
		h.Write(top.canon(m))
	}
	h.Sum(req.Conv[:0])
	req.Turn = position(shape, top)
	return req, nil
}

// topNames are, per shape, the top-level members ParseRequest keeps: the
// conversation fields, the stream flag and previous_response_id.
var topNames = func() map[Shape][]string {
	m := map[Shape][]string{}
	for sh, fs := range convFields {
		names := append([]string{"stream"}, fs...)
		if !slices.Contains(fs, "previous_response_id") {
			names = append(names, "previous_response_id")
		}
		m[sh] = names
	}
	return m
}()

// itemsFor names the members whose elements the turn rule reads.
func itemsFor(key string) bool { return key == "messages" || key == "input" }

// position counts the assistant turns a request already holds.
func position(shape Shape, top *topParser) int {
	switch shape {
	case ShapeChat, ShapeMessages:
		m := top.member("messages")
		n := 0
		for _, it := range m.items {
			if it.obj && it.roleString && it.role == "assistant" {
				n++
			}
		}
		return n
	case ShapeResponses:
		if top.member("previous_response_id").kind == '"' {
			return -1
		}
		in := top.member("input")
		if in.kind != '[' {
			return 0 // a string input: the first call
		}
		return responsesTurns(in.items)
	}
	return -1
}

// responsesTurns counts runs of model-produced items in a Responses input:
// one model turn can emit several items (reasoning, a message, function
// calls), and a run ends at the next user message or tool output.
func responsesTurns(items []item) int {
	n, inRun := 0, false
	for _, it := range items {
		if !it.obj {
			continue
		}
		typ, role := it.typ, it.role
		model := false
		switch {
		case typ == "message" || typ == "":
			model = role == "assistant"
		case typ == "reasoning":
			model = true
		case strings.HasSuffix(typ, "_call"):
			model = true // function_call, web_search_call, custom_tool_call ...
		case typ == "item_reference":
			continue // stands for an item we cannot see; it does not end a run
		}
		if model && !inRun {
			n++
		}
		inRun = model
	}
	return n
}
