package catalog

import (
	"fmt"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// BlobLocation says where a blob lives: which pack object, and the byte range
// of its stored (possibly compressed) form inside it. It mirrors the pack
// header entry so that a read needs neither the header nor the index file.
type BlobLocation struct {
	Pack        delta.ID       `json:"pack"`
	Type        delta.BlobType `json:"type"`
	Offset      uint64         `json:"offset"`
	Length      uint64         `json:"length"`     // stored bytes in the pack
	RawLength   uint64         `json:"raw_length"` // plaintext bytes
	Compression uint8          `json:"compression"`
}

func (loc *BlobLocation) validate() error {
	if loc.Pack.IsZero() {
		return fmt.Errorf("pack is zero")
	}
	switch loc.Type {
	case delta.BlobData, delta.BlobTree:
		return nil
	}
	return fmt.Errorf("unknown blob type %s", loc.Type)
}

// refValue is what a ref key stores: the kind and name are the key.
type refValue struct {
	Target delta.ID `json:"target"`
}

func checkRefName(kind delta.RefKind, name string) error {
	if !kind.Known() {
		return fmt.Errorf("ref kind %q: %w", kind, errdefs.ErrInvalid)
	}
	if !delta.ValidRefName(name) {
		return fmt.Errorf("ref %s/%s: name is not valid: %w", kind, name, errdefs.ErrInvalid)
	}
	return nil
}
