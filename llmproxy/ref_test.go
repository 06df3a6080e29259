package llmproxy

// The reference parser: decode into any, re-encode canonically. It is slow
// and obviously right; FuzzCanonMatchesReference holds the fast parser to it.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/turnsnap/turnsnap/internal/errdefs"

	"github.com/turnsnap/turnsnap/delta"
)

// parseReference reads a model call's JSON body. The caller bounds the body's
// size; nesting is bounded by encoding/json. A body that is not a JSON
// object is ErrInvalid: the proxy forwards it untouched and the upstream
// answers it.
func parseReference(shape Shape, body []byte) (Request, error) {
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
	req.Turn = refPosition(shape, top)
	return req, nil
}

// refPosition counts the assistant turns a request already holds.
func refPosition(shape Shape, top map[string]any) int {
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
		its := make([]item, len(items))
		for i, e := range items {
			if obj, ok := e.(map[string]any); ok {
				its[i].obj = true
				its[i].role, its[i].roleString = obj["role"].(string)
				its[i].typ, its[i].typeString = obj["type"].(string)
			}
		}
		return responsesTurns(its)
	}
	return -1
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
