// Package delta defines turnsnap's checkpoint content format: content-defined
// chunks, the BLAKE3 content hash, zstd blob compression, canonical tree
// objects, packs, sealing, records and the other stored objects, the rules a
// reader enforces on a stored state, and diffs of stored states. It reads and
// writes bytes, never a directory: walking and writing real directory trees
// is package fstree's.
//
// The byte-level specification is docs/FORMAT.md; this package is its
// reference implementation. delta knows nothing about where blobs are stored:
// it talks to storage through the narrow BlobSaver and BlobLoader interfaces.
package delta

import (
	"encoding/hex"
	"fmt"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/zeebo/blake3"
)

// ID names a blob, tree, pack or checkpoint record: the BLAKE3-256 hash of its
// plaintext bytes. BLAKE3 was measured at 2.4x the speed of SHA-256 (with SHA-NI)
// on 64 KiB chunks on our reference machines; see docs/FORMAT.md.
type ID [32]byte

// ShortLen is the number of hex digits Short prints; enough to be unique in
// any realistic catalog, and the CLI resolves prefixes anyway.
const ShortLen = 12

// Hash returns the plain (unkeyed) ID of data: the ID of a plaintext home,
// and the hash of things that are not content (the chunker's gear table).
// Code that names content uses its home's IDs.Hash.
func Hash(data []byte) ID { return ID(blake3.Sum256(data)) }

// ID schemes, as a home's config and a store's key object name them.
const (
	// SchemePlain is BLAKE3-256 of the plaintext: plaintext homes, and
	// encrypted homes made before keyed IDs (docs/FORMAT.md).
	SchemePlain = "blake3"
	// SchemeKeyed is keyed BLAKE3-256, the key derived from the store's
	// data key: new encrypted homes.
	SchemeKeyed = "blake3-keyed"
)

// IDs is a content ID scheme: how chunks, trees and packs are named. The
// zero value is plain BLAKE3; KeyedIDs gives keyed BLAKE3, so that equal
// plaintext under two keys gets unrelated names while it still
// deduplicates under one (docs/FORMAT.md, "Content IDs"). Every place that
// computes or checks a content ID takes the home's IDs explicitly: an ID
// checked under the wrong scheme never matches, so a mix-up fails loudly.
// IDs is a small value, safe to copy and to use concurrently.
type IDs struct {
	keyed bool
	key   [KeySize]byte
}

// KeyedIDs returns the keyed scheme for key.
func KeyedIDs(key [KeySize]byte) IDs { return IDs{keyed: true, key: key} }

// Keyed reports whether s is a keyed scheme.
func (s IDs) Keyed() bool { return s.keyed }

// Scheme names s: SchemePlain or SchemeKeyed.
func (s IDs) Scheme() string {
	if s.keyed {
		return SchemeKeyed
	}
	return SchemePlain
}

// String names the scheme and never shows the key: an IDs may end up in a
// log line or an error through the options that carry it.
func (s IDs) String() string { return s.Scheme() }

// GoString is String for %#v.
func (s IDs) GoString() string { return "delta.IDs(" + s.Scheme() + ")" }

// Hash returns the ID of data under s.
func (s IDs) Hash(data []byte) ID {
	if !s.keyed {
		return Hash(data)
	}
	h := s.New()
	h.Write(data)
	var id ID
	h.Sum(id[:0])
	return id
}

// New returns a streaming hasher whose Sum(nil) is an ID's bytes under s.
func (s IDs) New() *blake3.Hasher {
	if !s.keyed {
		return blake3.New()
	}
	h, err := blake3.NewKeyed(s.key[:])
	if err != nil {
		panic(err) // only a wrong key size, which the array rules out
	}
	return h
}

// emptyTreeID is the plain ID of the empty tree; IDs.EmptyTree gives it
// under any scheme.
var emptyTreeID = Hash((&Tree{}).Encode())

// EmptyTree returns the plain ID of the tree with no entries (tests and
// plaintext-only tools); a home's code uses its IDs.EmptyTree.
func EmptyTree() ID { return emptyTreeID }

// EmptyTree returns the ID of the tree with no entries under s.
func (s IDs) EmptyTree() ID {
	if !s.keyed {
		return emptyTreeID
	}
	return s.Hash((&Tree{}).Encode())
}

// ParseID parses a full 64-digit lowercase or uppercase hex ID.
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != 2*len(id) {
		return id, fmt.Errorf("id %q: want %d hex digits: %w", s, 2*len(id), errdefs.ErrInvalid)
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return id, fmt.Errorf("id %q: %v: %w", s, err, errdefs.ErrInvalid)
	}
	return id, nil
}

// String returns the full lowercase hex form.
func (id ID) String() string { return hex.EncodeToString(id[:]) }

// Short returns the first ShortLen hex digits, for display.
func (id ID) Short() string { return id.String()[:ShortLen] }

// IsZero reports whether id is the zero ID, which names nothing.
func (id ID) IsZero() bool { return id == ID{} }

// MarshalText encodes id as hex; the zero ID encodes as the empty string so
// that optional IDs (a root checkpoint's parent) read naturally in JSON.
func (id ID) MarshalText() ([]byte, error) {
	if id.IsZero() {
		return []byte{}, nil
	}
	return []byte(id.String()), nil
}

// UnmarshalText is the inverse of MarshalText.
func (id *ID) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*id = ID{}
		return nil
	}
	v, err := ParseID(string(b))
	if err != nil {
		return err
	}
	*id = v
	return nil
}
