package delta

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Object names in the store besides packs (docs/FORMAT.md, "Store layout").
// Records and packs are content-addressed and immutable; sandbox descriptions
// and refs are the few small mutable objects, rewritten whole.
const (
	RecordPrefix  = "records/"
	SandboxPrefix = "sandboxes/"
	HeadPrefix    = "refs/heads/"
	TagPrefix     = "refs/tags/"
	// LockPrefix starts lock objects: LockPrefix || kind || "-" || host ||
	// "-" || nonce, holding a Lock (docs/STORAGE.md, "Sharing a bucket").
	LockPrefix = "locks/"
)

// Lock is the JSON content of a lock object: a push or gc in progress.
type Lock struct {
	Kind    string    `json:"kind"` // "push" or "gc"
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Created time.Time `json:"created"`
}

// MaxSmallObject bounds what a reader accepts for a ref, a sandbox object
// or a lock (docs/FORMAT.md, "Limits").
const MaxSmallObject = 64 << 10

// RecordName is the store name of the record whose hash is id.
func RecordName(id ID) string { return RecordPrefix + id.String() }

// SandboxName is the store name of sandbox name's description.
func SandboxName(name string) string { return SandboxPrefix + name }

// RefName is the store name of the ref kind/name.
func RefName(kind RefKind, name string) string {
	if kind == RefTag {
		return TagPrefix + name
	}
	return HeadPrefix + name
}

// EncodeRef is the content of a ref object: the target's hex ID and a newline.
func EncodeRef(id ID) []byte { return []byte(id.String() + "\n") }

// ParseRef parses the content of a ref object.
func ParseRef(data []byte) (ID, error) {
	return ParseID(strings.TrimSpace(string(data)))
}

// Sandbox describes a sandbox: what it was created from and how it is run.
// It is stored as JSON under SandboxName(Name) and indexed by the catalog;
// its checkpoints and head are kept separately (records, RefHead) so that
// checkpointing never rewrites it.
type Sandbox struct {
	Name     string    `json:"name"`
	Backend  string    `json:"backend"`
	BaseTree ID        `json:"base_tree"`
	Origin   ID        `json:"origin"` // checkpoint it was branched from; zero if created from a base
	Created  time.Time `json:"created"`
	// Config is the backend's typed options as that backend encodes them
	// (btrfs: btrfs.Options, {"pool": DIR}); absent for backends without
	// options. It is kept as raw JSON so this package need not know every
	// backend, and a description written when Config was a string map
	// decodes unchanged.
	Config json.RawMessage `json:"config,omitempty"`
}

// Validate checks what every stored description must satisfy.
func (sb *Sandbox) Validate() error {
	switch {
	case !ValidRefName(sb.Name):
		return fmt.Errorf("sandbox name %q is not valid", sb.Name)
	case sb.Backend == "":
		return fmt.Errorf("sandbox %s: backend is empty", sb.Name)
	case sb.BaseTree.IsZero():
		return fmt.Errorf("sandbox %s: base tree is zero", sb.Name)
	}
	return nil
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

// Known reports whether k is a kind this format defines.
func (k RefKind) Known() bool { return k == RefHead || k == RefTag }

// Ref is a name pointing at a checkpoint.
type Ref struct {
	Kind   RefKind
	Name   string
	Target ID
}

// String prints the ref as "kind/name", the form used in error messages.
func (r Ref) String() string { return string(r.Kind) + "/" + r.Name }
