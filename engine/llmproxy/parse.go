package llmproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
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
// size; nesting is bounded by encoding/json. A body that is not a JSON
// object is ErrInvalid: the proxy forwards it untouched and the upstream
// answers it.
func ParseRequest(shape Shape, body []byte) (Request, error) {
	req := Request{Shape: shape, Turn: -1}
	fields, ok := convFields[shape]
	if !ok {
		return req, fmt.Errorf("request shape %q: %w", shape, errdefs.ErrInvalid)
	}
	top, err := decodeObject(body)
	if err != nil {
		return req, fmt.Errorf("%s request body: %w: %v", shape, errdefs.ErrInvalid, err)
	}
	if s, ok := top["stream"].(bool); ok {
		req.Stream = s
	}
	c := &canon{}
	c.out.WriteString(convDomain)
	c.out.WriteString(string(shape))
	for _, f := range fields {
		v, ok := top[f]
		if !ok || v == nil {
			continue
		}
		c.out.WriteString("\x00" + f + "\x00")
		if err := c.value(v); err != nil {
			return req, fmt.Errorf("%s request field %s: %w: %v", shape, f, errdefs.ErrInvalid, err)
		}
	}
	req.Conv = delta.Hash(c.out.Bytes())
	req.Turn = position(shape, top)
	return req, nil
}

// position counts the assistant turns a request already holds.
func position(shape Shape, top map[string]any) int {
	switch shape {
	case ShapeChat, ShapeMessages:
		msgs, _ := top["messages"].([]any)
		n := 0
		for _, m := range msgs {
			if obj, ok := m.(map[string]any); ok && obj["role"] == "assistant" {
				n++
			}
		}
		return n
	case ShapeResponses:
		if _, chained := top["previous_response_id"].(string); chained {
			return -1
		}
		items, ok := top["input"].([]any)
		if !ok {
			return 0 // a string input: the first call
		}
		return responsesTurns(items)
	}
	return -1
}

// responsesTurns counts runs of model-produced items in a Responses input:
// one model turn can emit several items (reasoning, a message, function
// calls), and a run ends at the next user message or tool output.
func responsesTurns(items []any) int {
	n, inRun := 0, false
	for _, it := range items {
		obj, ok := it.(map[string]any)
		if !ok {
			continue
		}
		typ, _ := obj["type"].(string)
		role, _ := obj["role"].(string)
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

// decodeObject decodes a JSON object keeping numbers as their literal text,
// so the canonical form never rounds them.
func decodeObject(body []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var top map[string]any
	if err := dec.Decode(&top); err != nil {
		return nil, err
	}
	if top == nil {
		return nil, errors.New("not a JSON object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the JSON object")
	}
	return top, nil
}

// canon writes JSON values in canonical form: compact, object keys sorted,
// null members dropped (SDKs differ on whether an absent field is written
// as null), strings escaped as encoding/json does without HTML escaping.
type canon struct {
	out bytes.Buffer
	tmp bytes.Buffer
}

func (c *canon) value(v any) error {
	switch x := v.(type) {
	case nil:
		c.out.WriteString("null")
	case bool:
		if x {
			c.out.WriteString("true")
		} else {
			c.out.WriteString("false")
		}
	case json.Number:
		c.out.WriteString(x.String())
	case string:
		return c.str(x)
	case []any:
		c.out.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				c.out.WriteByte(',')
			}
			if err := c.value(e); err != nil {
				return err
			}
		}
		c.out.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k, e := range x {
			if e != nil {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		c.out.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				c.out.WriteByte(',')
			}
			if err := c.str(k); err != nil {
				return err
			}
			c.out.WriteByte(':')
			if err := c.value(x[k]); err != nil {
				return err
			}
		}
		c.out.WriteByte('}')
	default:
		return fmt.Errorf("unexpected JSON value %T", v)
	}
	return nil
}

func (c *canon) str(s string) error {
	if plain(s) {
		c.out.WriteByte('"')
		c.out.WriteString(s)
		c.out.WriteByte('"')
		return nil
	}
	c.tmp.Reset()
	enc := json.NewEncoder(&c.tmp)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return err
	}
	c.out.Write(bytes.TrimSuffix(c.tmp.Bytes(), []byte("\n")))
	return nil
}

// plain says s is printable ASCII needing no escape: the common case, and
// encoding/json would write it unchanged between quotes.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b < 0x20 || b >= 0x7f || b == '"' || b == '\\' {
			return false
		}
	}
	return true
}

// Canonical returns v's canonical JSON (for tests and tools that want to see
// what a conversation hash covers).
func canonical(v any) ([]byte, error) {
	c := &canon{}
	err := c.value(v)
	return c.out.Bytes(), err
}
