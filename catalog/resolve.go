package catalog

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// MinPrefixLen is the shortest hex prefix ResolveCheckpoint accepts: shorter
// ones are ambiguous in any catalog of real size, and would shadow short
// hex-looking tag names such as "add" or "c0".
const MinPrefixLen = 4

// maxCandidates is how many matches an ambiguity error lists.
const maxCandidates = 5

// MaxBack bounds N in REF~N: a walk of first parents reads one record per
// step, and no history a person means by counting is longer.
const MaxBack = 10000

// CheckpointRef is a checkpoint reference as a user writes it, parsed
// (ParseCheckpointRef): a base, then Back first parents before it.
type CheckpointRef struct {
	// Head says the base is a sandbox's head: "HEAD" (the sandbox the
	// command is about) or "NAME@HEAD" (Sandbox is NAME).
	Head    bool
	Sandbox delta.SandboxName
	// Base is the ID, prefix or tag when Head is false.
	Base string
	// Back is the N of "~N" ("~" alone is 1, as in git; "~2~3" is 5).
	Back int
	// text is what the user typed, for errors.
	text string
}

// String is the reference as the user typed it.
func (r CheckpointRef) String() string { return r.text }

// IsZero says r is the zero CheckpointRef, which no parse returns: callers
// use it for "no reference given" (a diff's head or live root, verify's
// every record).
func (r CheckpointRef) IsZero() bool { return r == CheckpointRef{} }

// IDRef is the reference to checkpoint id by its full ID, for a caller
// that holds an ID rather than what a user typed.
func IDRef(id delta.ID) CheckpointRef {
	s := id.String()
	return CheckpointRef{Base: s, text: s}
}

// ParseCheckpointRef parses what a user typed as a checkpoint:
//
//	ID | PREFIX | TAG | HEAD | NAME@HEAD, each optionally followed by ~N
//
// Tags and sandbox names are ValidRefNames, which hold neither '@' nor
// '~', so these forms shadow no name; "HEAD" alone would be a tag's name,
// and Tag refuses it. Anything else with '@' or '~' is ErrInvalid saying
// which forms exist.
func ParseCheckpointRef(s string) (CheckpointRef, error) {
	r := CheckpointRef{text: s}
	bad := func(why string) error {
		return fmt.Errorf("checkpoint %q: %s (forms: ID, ID prefix, TAG, HEAD, NAME@HEAD, each optionally followed by ~N): %w",
			s, why, errdefs.ErrInvalid)
	}
	if s == "" {
		return r, fmt.Errorf("checkpoint: empty name: %w", errdefs.ErrInvalid)
	}
	base, back, hasBack := strings.Cut(s, "~")
	if hasBack {
		for _, step := range strings.Split(back, "~") {
			n := 1
			if step != "" {
				if len(step) > 5 || strings.Trim(step, "0123456789") != "" {
					return r, bad(fmt.Sprintf("~%s is not ~N with N a number up to %d", step, MaxBack))
				}
				n, _ = strconv.Atoi(step)
			}
			if r.Back += n; r.Back > MaxBack {
				return r, bad(fmt.Sprintf("goes back %d checkpoints, more than %d", r.Back, MaxBack))
			}
		}
	}
	name, rev, hasAt := strings.Cut(base, "@")
	switch {
	case base == "":
		return r, bad("~N follows nothing")
	case hasAt && rev != "HEAD":
		return r, bad(fmt.Sprintf("NAME@%s: only NAME@HEAD names a sandbox's checkpoint", rev))
	case hasAt && !delta.ValidRefName(name):
		return r, bad(fmt.Sprintf("%q is not a sandbox name", name))
	case hasAt:
		r.Head, r.Sandbox = true, delta.SandboxName(name)
	case base == "HEAD":
		r.Head = true
	default:
		r.Base = base
	}
	return r, nil
}

// ResolveRef turns a parsed reference into a checkpoint ID, for a command
// about sandbox ("" if it names none), by the rules of ResolveIn.
func (tx *Tx) ResolveRef(sandbox delta.SandboxName, r CheckpointRef) (delta.ID, error) {
	return ResolveIn(txRefs{tx}, sandbox, r)
}

// RefSource is where ResolveIn looks a reference's parts up: the catalog
// (a transaction), or a store read without one (verify --store-only).
// Both resolve by the same rules because only these lookups differ.
type RefSource interface {
	// Head is the head of the sandbox labelled name; ErrNotFound if
	// there is no such sandbox.
	Head(name delta.SandboxName) (delta.ID, error)
	// Tag is the checkpoint tag name names; found is false when there is
	// no such tag.
	Tag(name string) (id delta.ID, found bool, err error)
	// MatchPrefix returns up to limit IDs of checkpoints whose hex form
	// starts with the lowercase hex string p.
	MatchPrefix(p string, limit int) ([]delta.ID, error)
	// Checkpoint reads a checkpoint; ErrNotFound if it is not there.
	Checkpoint(id delta.ID) (*delta.Checkpoint, error)
}

// ResolveIn turns a parsed reference (ParseCheckpointRef) into a
// checkpoint ID, for a command about sandbox ("" if it names none),
// looking it up in src: a full hex
// ID, a hex prefix of at least MinPrefixLen digits that matches exactly one
// checkpoint, a tag name, HEAD (sandbox's head) or NAME@HEAD (sandbox
// NAME's head), and any of them followed by ~N: N first parents before it.
// A hex string that matches a checkpoint wins over a tag of the same name;
// a tag is tried when s is not hex or matches none. An ambiguous prefix or
// a malformed reference is ErrInvalid; nothing found, or a walk that
// reaches the first checkpoint or a pruned one, is ErrNotFound.
func ResolveIn(src RefSource, sandbox delta.SandboxName, r CheckpointRef) (delta.ID, error) {
	s := r.String()
	var id delta.ID
	var err error
	if r.Head {
		name := r.Sandbox
		if name == "" {
			name = sandbox
		}
		if name == "" {
			return delta.ID{}, fmt.Errorf("checkpoint %q: this command names no sandbox whose HEAD it could be: write NAME@HEAD: %w",
				s, errdefs.ErrInvalid)
		}
		if id, err = src.Head(name); err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				return delta.ID{}, fmt.Errorf("checkpoint %q: no sandbox %s: %w", s, name, errdefs.ErrNotFound)
			}
			return delta.ID{}, fmt.Errorf("checkpoint %q: %w", s, err)
		}
	} else if id, err = resolveBase(src, r.Base); err != nil {
		return delta.ID{}, err
	}
	return WalkBack(s, id, r.Back, src.Checkpoint)
}

// txRefs is the catalog as a RefSource.
type txRefs struct{ tx *Tx }

func (t txRefs) Head(name delta.SandboxName) (delta.ID, error) { return t.tx.Head(name) }

func (t txRefs) Tag(name string) (delta.ID, bool, error) {
	id, err := t.tx.GetRef(delta.RefTag, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return delta.ID{}, false, nil
	}
	return id, err == nil, err
}

func (t txRefs) MatchPrefix(p string, limit int) ([]delta.ID, error) {
	return t.tx.matchPrefix(p, limit)
}

func (t txRefs) Checkpoint(id delta.ID) (*delta.Checkpoint, error) {
	if err := t.tx.ctx.Err(); err != nil {
		return nil, err
	}
	return t.tx.Checkpoint(id)
}

// WalkBack returns the checkpoint n first parents before id (ref is what
// the user typed, for errors), reading records with get, which returns
// ErrNotFound for a record it does not have. Reaching a checkpoint with no
// parent, or a parent no longer there (pruned), is ErrNotFound naming the
// checkpoint where the walk stopped. It serves the catalog and the store
// alone (verify --store-only) alike.
func WalkBack(ref string, id delta.ID, n int, get func(delta.ID) (*delta.Checkpoint, error)) (delta.ID, error) {
	cur := id
	for i := 0; i < n; i++ {
		cp, err := get(cur)
		if err != nil {
			return delta.ID{}, fmt.Errorf("checkpoint %q: %w", ref, err)
		}
		if cp.Parent.IsZero() {
			return delta.ID{}, fmt.Errorf("checkpoint %q: stopped %d back at %s (%s turn %d), which has no parent: %w",
				ref, i, cp.ID.Short(), cp.Sandbox, cp.Turn, errdefs.ErrNotFound)
		}
		if _, err := get(cp.Parent); err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				return delta.ID{}, fmt.Errorf("checkpoint %q: stopped %d back at %s (%s turn %d): its parent %s is gone (pruned): %w",
					ref, i, cp.ID.Short(), cp.Sandbox, cp.Turn, cp.Parent.Short(), errdefs.ErrNotFound)
			}
			return delta.ID{}, fmt.Errorf("checkpoint %q: %w", ref, err)
		}
		cur = cp.Parent
	}
	return cur, nil
}

// resolveBase resolves an ID, a prefix or a tag.
func resolveBase(src RefSource, s string) (delta.ID, error) {
	hexLike := isHex(s) && len(s) <= 2*len(delta.ID{})
	if hexLike && len(s) >= MinPrefixLen {
		matches, err := src.MatchPrefix(strings.ToLower(s), maxCandidates+1)
		if err != nil {
			return delta.ID{}, fmt.Errorf("resolve checkpoint %q: %w", s, err)
		}
		switch {
		case len(matches) == 1:
			return matches[0], nil
		case len(matches) > 1:
			return delta.ID{}, ambiguous(src, s, matches)
		}
	}
	if delta.ValidRefName(s) {
		id, found, err := src.Tag(s)
		if err != nil {
			return delta.ID{}, err
		}
		if found {
			return id, nil
		}
	}
	if hexLike && len(s) < MinPrefixLen {
		return delta.ID{}, fmt.Errorf("checkpoint %q: no such tag, and a checkpoint prefix needs at least %d hex digits: %w",
			s, MinPrefixLen, errdefs.ErrInvalid)
	}
	return delta.ID{}, fmt.Errorf("checkpoint %q: no checkpoint or tag by that name: %w", s, errdefs.ErrNotFound)
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// matchPrefix returns up to limit checkpoint IDs whose hex form starts with
// the lowercase hex string p. The scan covers the whole bytes of p; an odd
// final digit is matched by filtering.
func (tx *Tx) matchPrefix(p string, limit int) ([]delta.ID, error) {
	whole, err := hex.DecodeString(p[:len(p)&^1])
	if err != nil {
		return nil, err
	}
	if len(whole) == len(delta.ID{}) {
		id := delta.ID(whole)
		has, err := tx.has(checkpointKey(id))
		if err != nil || !has {
			return nil, err
		}
		return []delta.ID{id}, nil
	}
	var out []delta.ID
	stop := errors.New("enough matches")
	err = tx.scan(append([]byte{prefixCheckpoint}, whole...), false, func(key, _ []byte) error {
		id, _ := idFromSuffix(key)
		if strings.HasPrefix(id.String(), p) {
			out = append(out, id)
		}
		if len(out) >= limit {
			return stop
		}
		return nil
	})
	if err != nil && err != stop {
		return nil, err
	}
	return out, nil
}

// ambiguous builds the error for a prefix with several matches, naming each
// candidate with enough digits to tell them apart and its sandbox and turn,
// which is usually what the user recognises.
func ambiguous(src RefSource, s string, matches []delta.ID) error {
	digits := min(max(delta.ShortLen, len(s)+4), 2*len(delta.ID{}))
	var b strings.Builder
	for i, id := range matches {
		if i == maxCandidates {
			b.WriteString(", ...")
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(id.String()[:digits])
		if cp, err := src.Checkpoint(id); err == nil {
			fmt.Fprintf(&b, " (%s turn %d)", cp.Sandbox, cp.Turn)
		}
	}
	return fmt.Errorf("checkpoint prefix %q is ambiguous: matches %s: %w", s, b.String(), errdefs.ErrInvalid)
}
