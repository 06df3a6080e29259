package catalog

import (
	"fmt"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Sandbox is a sandbox's catalog entry: what it was created from and how it is
// run. Its checkpoints and head are kept separately (SandboxCheckpoints,
// RefHead) so that checkpointing never rewrites this entry.
type Sandbox struct {
	Name     string            `json:"name"`
	Backend  string            `json:"backend"`
	BaseTree delta.ID          `json:"base_tree"`
	Origin   delta.ID          `json:"origin"` // checkpoint it was branched from; zero if created from a base
	Created  time.Time         `json:"created"`
	Config   map[string]string `json:"config,omitempty"` // backend-specific settings (e.g. btrfs pool)
}

func (sb *Sandbox) validate() error {
	switch {
	case !ValidName(sb.Name):
		return fmt.Errorf("sandbox name %q is not valid", sb.Name)
	case sb.Backend == "":
		return fmt.Errorf("sandbox %s: backend is empty", sb.Name)
	case sb.BaseTree.IsZero():
		return fmt.Errorf("sandbox %s: base tree is zero", sb.Name)
	}
	return nil
}

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

// RefKind says what namespace a ref name lives in.
type RefKind string

const (
	// RefHead is a sandbox's current checkpoint; there is one per sandbox and
	// its name is the sandbox name.
	RefHead RefKind = "head"
	// RefTag is a user-given name for a checkpoint.
	RefTag RefKind = "tag"
)

func (k RefKind) known() bool { return k == RefHead || k == RefTag }

// Ref is a name pointing at a checkpoint.
type Ref struct {
	Kind   RefKind
	Name   string
	Target delta.ID
}

// String prints the ref as "kind/name", the form used in error messages.
func (r Ref) String() string { return string(r.Kind) + "/" + r.Name }

// refValue is what a ref key stores: the kind and name are the key.
type refValue struct {
	Target delta.ID `json:"target"`
}

func checkRefName(kind RefKind, name string) error {
	if !kind.known() {
		return fmt.Errorf("ref kind %q: %w", kind, errdefs.ErrInvalid)
	}
	if !ValidName(name) {
		return fmt.Errorf("ref %s/%s: name is not valid: %w", kind, name, errdefs.ErrInvalid)
	}
	return nil
}
