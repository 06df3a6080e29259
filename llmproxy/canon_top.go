package llmproxy

import (
	"errors"
	"fmt"
	"sync"
)

// The request's top-level object: the members the conversation hash and the
// turn rule read, in canonical form, with a pooled parser so that the
// proxy's request path allocates almost nothing.

// topMember is one member of the request's top-level object.
type topMember struct {
	present    bool
	start, end int    // canonical value, in the parser's out
	items      []item // for conversation arrays: each element's role and type
	kind       byte   // first byte of the canonical value: '{', '[', '"', 't', 'f', 'n' or a digit
}

// topParser reads a request body. It is pooled (topParsers): its buffers
// grow to the size of a conversation once and are reused by later calls.
type topParser struct {
	canonParser
	names []string // the members kept, in the order of top
	top   [8]topMember
}

// slot is name's index in top, or -1 for a member not kept.
func (t *topParser) slot(name string) int {
	for i, n := range t.names {
		if n == name {
			return i
		}
	}
	return -1
}

// member returns the member name as parsed (the zero topMember if absent or
// not kept).
func (t *topParser) member(name string) topMember {
	if i := t.slot(name); i >= 0 {
		return t.top[i]
	}
	return topMember{}
}

func (t *topParser) canon(m topMember) []byte { return t.out[m.start:m.end] }

var topParsers = sync.Pool{New: func() any { return new(topParser) }}

// maxPooled bounds the buffers a pooled parser keeps: one huge conversation
// must not pin its size in memory for good.
const maxPooled = 1 << 20

func (t *topParser) release() {
	if cap(t.out) > maxPooled || cap(t.scratch) > maxPooled {
		return
	}
	t.b = nil
	clear(t.members[:cap(t.members)]) // they point into the body
	clear(t.keep[:cap(t.keep)])
	t.members, t.keep = t.members[:0], t.keep[:0]
	topParsers.Put(t)
}

// parseTop reads a request body: a JSON object whose members named in
// names (at most len(top)) are kept in canonical form, the conversation
// arrays (itemsFor) with their elements' roles and types; every other member
// is validated and dropped. The caller releases the parser.
func parseTop(body []byte, names []string) (*topParser, error) {
	t := topParsers.Get().(*topParser)
	*t = topParser{canonParser: canonParser{b: body, out: t.out[:0], members: t.members[:0], keep: t.keep[:0], scratch: t.scratch[:0]},
		names: names, top: t.top}
	for i := range t.top {
		t.top[i] = topMember{items: t.top[i].items[:0]}
	}
	p := &t.canonParser
	p.ws()
	if p.i >= len(body) || body[p.i] != '{' {
		t.release()
		return nil, errors.New("not a JSON object")
	}
	p.i++
	p.depth = 1
	err := t.members1()
	if err == nil {
		p.ws()
		if p.i != len(body) {
			err = fmt.Errorf("trailing data after the JSON object")
		}
	}
	if err != nil {
		t.release()
		return nil, err
	}
	return t, nil
}

func (t *topParser) members1() error {
	p := &t.canonParser
	body := p.b
	p.ws()
	if p.i < len(body) && body[p.i] == '}' {
		p.i++
		return nil
	}
	for {
		p.ws()
		if p.i >= len(body) || body[p.i] != '"' {
			return errSyntax
		}
		key, err := p.key()
		if err != nil {
			return err
		}
		p.ws()
		if p.i >= len(body) || body[p.i] != ':' {
			return errSyntax
		}
		p.i++
		slot := t.slot(string(key))
		start := len(p.out)
		var items []item
		if slot >= 0 && itemsFor(string(key)) {
			items = t.top[slot].items[:0]
			p.items = &items
		}
		if err := p.value(); err != nil {
			return err
		}
		p.items = nil
		if slot >= 0 { // a later duplicate wins, as in a decoded map
			t.top[slot] = topMember{present: true, start: start, end: len(p.out), items: items, kind: p.out[start]}
		} else {
			p.out = p.out[:start] // validated, not kept
		}
		p.ws()
		if p.i >= len(body) {
			return errSyntax
		}
		if body[p.i] == '}' {
			p.i++
			return nil
		}
		if body[p.i] != ',' {
			return errSyntax
		}
		p.i++
	}
}
