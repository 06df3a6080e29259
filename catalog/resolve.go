package catalog

import (
	"encoding/hex"
	"errors"
	"fmt"
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

// ResolveCheckpoint turns what a user typed into a checkpoint ID: a full hex
// ID, a hex prefix of at least MinPrefixLen digits that matches exactly one
// checkpoint, or a tag name. A hex string that matches a checkpoint wins over
// a tag of the same name; a tag is tried when s is not hex or matches none.
// An ambiguous prefix is ErrInvalid listing some candidates; nothing found is
// ErrNotFound.
func (tx *Tx) ResolveCheckpoint(s string) (delta.ID, error) {
	if s == "" {
		return delta.ID{}, fmt.Errorf("checkpoint: empty name: %w", errdefs.ErrInvalid)
	}
	hexLike := isHex(s) && len(s) <= 2*len(delta.ID{})
	if hexLike && len(s) >= MinPrefixLen {
		matches, err := tx.matchPrefix(strings.ToLower(s), maxCandidates+1)
		if err != nil {
			return delta.ID{}, fmt.Errorf("resolve checkpoint %q: %w", s, err)
		}
		switch {
		case len(matches) == 1:
			return matches[0], nil
		case len(matches) > 1:
			return delta.ID{}, tx.ambiguous(s, matches)
		}
	}
	if delta.ValidRefName(s) {
		id, err := tx.GetRef(delta.RefTag, s)
		if err == nil {
			return id, nil
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			return delta.ID{}, err
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
func (tx *Tx) ambiguous(s string, matches []delta.ID) error {
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
		if cp, err := tx.Checkpoint(id); err == nil {
			fmt.Fprintf(&b, " (%s turn %d)", cp.Sandbox, cp.Turn)
		}
	}
	return fmt.Errorf("checkpoint prefix %q is ambiguous: matches %s: %w", s, b.String(), errdefs.ErrInvalid)
}
