package delta

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
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

// Lock is the JSON content of a lock object: a push or gc in progress. A
// lock carries its own clock: its holder rewrites it (Refreshed) at least
// every StaleAfter/3, and a lock whose Refreshed (or, if later, the store's
// modification time) is more than StaleAfter old is stale: its holder
// stopped, and readers ignore it. A holder that cannot refresh in time
// cancels its own operation before its lock could be judged stale.
//
// A lock also names its holder process closely enough (BootID, PIDNS,
// PIDStart) for a reader on the same machine to see that the holder is gone
// before the window passes; readers elsewhere judge by the clock alone.
type Lock struct {
	Kind    string    `json:"kind"` // "push" or "gc"
	Host    string    `json:"host"` // the holder's hostname
	PID     int       `json:"pid"`
	Home    string    `json:"home,omitempty"` // the holder's home id
	Created time.Time `json:"created"`
	// Refreshed is when the holder last wrote the lock (UTC); zero in locks
	// written before it existed, which are judged by modification time.
	Refreshed time.Time `json:"refreshed,omitempty"`
	// StaleAfterNs is the holder's promise: it refreshes well within this
	// window. Zero means LegacyLockStaleAfter (locks written before the
	// field existed).
	StaleAfterNs int64 `json:"stale_after_ns,omitempty"`
	// BootID is the holder's kernel boot id
	// (/proc/sys/kernel/random/boot_id) and PIDNS its pid namespace (the
	// target of /proc/self/ns/pid, "pid:[N]"): with Host they say whether a
	// reader runs on the same machine, since the last boot, where PID means
	// the same process. Empty in locks written before they existed, and
	// when the holder could not read them; such locks are judged by their
	// clock alone.
	BootID string `json:"boot_id,omitempty"`
	PIDNS  string `json:"pid_ns,omitempty"`
	// PIDStart is the holder's start time, field 22 of /proc/PID/stat
	// (clock ticks after boot): a live process with the holder's PID but
	// another start time took a recycled pid. Zero if unknown.
	PIDStart uint64 `json:"pid_start,omitempty"`
}

// DefaultLockStaleAfter is the stale window a holder promises unless its
// home's config says otherwise: a killed push or gc blocks other hosts for
// at most this long (and none on its own machine, which sees it is gone).
const DefaultLockStaleAfter = time.Minute

// LegacyLockStaleAfter is the window of a lock that states none: written
// before stale_after_ns existed, by a holder that promised 10 minutes.
const LegacyLockStaleAfter = 10 * time.Minute

// Window is the stale window the lock states.
func (l *Lock) Window() time.Duration {
	if l.StaleAfterNs <= 0 {
		return LegacyLockStaleAfter
	}
	return time.Duration(l.StaleAfterNs)
}

// LastRefresh is the later of Refreshed and the store's modification time
// of the object.
func (l *Lock) LastRefresh(modTime time.Time) time.Time {
	if modTime.After(l.Refreshed) {
		return modTime
	}
	return l.Refreshed
}

// StaleIn is how long until the lock goes stale by its clock, judged at
// now; zero or less once it is.
func (l *Lock) StaleIn(modTime, now time.Time) time.Duration {
	return l.LastRefresh(modTime).Add(l.Window()).Sub(now)
}

// Stale reports whether the lock's holder has stopped refreshing it, judged
// at now; modTime is the store's modification time of the object. It is
// the rule every host applies; a host on the holder's machine may also
// find the holder gone sooner (engine/remote).
func (l *Lock) Stale(modTime, now time.Time) bool {
	return l.StaleIn(modTime, now) < 0
}

// MaxSmallObject bounds what a reader accepts for a ref, a sandbox object
// or a lock (docs/FORMAT.md, "Limits").
const MaxSmallObject = 64 << 10

// RecordName is the store name of the record whose hash is id.
func RecordName(id ID) string { return RecordPrefix + id.String() }

// SandboxObject is the store name of a sandbox's description; key is the
// sandbox's Key (its id, or a legacy sandbox's name).
func SandboxObject(key SandboxKey) string { return SandboxPrefix + string(key) }

// HeadObject is the store name of a sandbox's head, RefName(RefHead, key).
func HeadObject(key SandboxKey) string { return RefName(RefHead, string(key)) }

// RefName is the store name of the ref kind/name. A head's name is its
// sandbox's Key, so two homes' sandboxes of one name keep separate heads;
// tags are named by the user and shared by every home of the bucket.
func RefName(kind RefKind, name string) string {
	if kind == RefTag {
		return TagPrefix + name
	}
	return HeadPrefix + name
}

// EncodeRef is the content of a ref object: the target's hex ID and a newline.
func EncodeRef(id ID) []byte { return []byte(id.String() + "\n") }

// ParseRef parses the content of a ref object: a tag, or a head with or
// without its owner line (ParseHead).
func ParseRef(data []byte) (ID, error) {
	id, _, err := ParseHead(data)
	return id, err
}

// Sandbox describes a sandbox: what it was created from and how it is run.
// It is stored as JSON under SandboxObject(Key()) and indexed by the catalog;
// its checkpoints and head are kept separately (records, RefHead) so that
// checkpointing never rewrites it.
type Sandbox struct {
	// ID is the sandbox's identity (32 lowercase hex digits, random), so
	// that sandboxes of one name on two homes sharing a bucket never merge.
	// Empty in descriptions written before it existed (legacy, identified
	// by Name).
	ID string `json:"id,omitempty"`
	// Home is the id of the home that created the sandbox, the only home
	// whose prune may delete its checkpoints. Empty in legacy descriptions.
	Home     string      `json:"home,omitempty"`
	Name     SandboxName `json:"name"` // label on its home (a ValidRefName)
	Backend  string      `json:"backend"`
	BaseTree ID          `json:"base_tree"`
	Origin   ID          `json:"origin"` // checkpoint it was branched from; zero if created from a base
	Created  time.Time   `json:"created"`
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
	case !ValidRefName(string(sb.Name)):
		return fmt.Errorf("sandbox name %q is not valid", sb.Name)
	case sb.Backend == "":
		return fmt.Errorf("sandbox %s: backend is empty", sb.Name)
	case sb.BaseTree.IsZero():
		return fmt.Errorf("sandbox %s: base tree is zero", sb.Name)
	case sb.ID != "" && !ValidSandboxID(sb.ID):
		return fmt.Errorf("sandbox %s: id %q is not valid", sb.Name, sb.ID)
	case sb.Home != "" && !ValidSandboxID(sb.Home):
		return fmt.Errorf("sandbox %s: home id %q is not valid", sb.Name, sb.Home)
	}
	return nil
}

// Key is what names the sandbox's description and head in the store: its
// ID, or a legacy sandbox's Name.
func (sb *Sandbox) Key() SandboxKey {
	if sb.ID != "" {
		return SandboxKey(sb.ID)
	}
	return SandboxKey(sb.Name)
}

// NewSandboxID returns a fresh random id, for a sandbox or a home.
func NewSandboxID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand: " + err.Error()) // never fails on Linux
	}
	return hex.EncodeToString(b)
}

// ValidSandboxID reports whether s has the form of a sandbox or home id:
// 32 lowercase hex digits.
func ValidSandboxID(s string) bool {
	if len(s) != 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !(s[i] >= '0' && s[i] <= '9' || s[i] >= 'a' && s[i] <= 'f') {
			return false
		}
	}
	return true
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

// MaxSandboxObject bounds the size of a sandbox description a reader
// accepts (real ones are a few hundred bytes).
const MaxSandboxObject = 64 << 10

// DecodeSandbox decodes the description stored under the object name,
// which must be the one its content claims (docs/FORMAT.md, "Sandbox
// identity"): a description under one name that claims another sandbox
// would graft that sandbox's history onto another. Errors are ErrCorrupt
// and name the object.
func DecodeSandbox(name string, data []byte) (*Sandbox, error) {
	if len(data) > MaxSandboxObject {
		return nil, fmt.Errorf("object %s: %d bytes, more than %d: %w", name, len(data), MaxSandboxObject, errdefs.ErrCorrupt)
	}
	var sb Sandbox
	if err := json.Unmarshal(data, &sb); err != nil {
		return nil, fmt.Errorf("object %s: %v: %w", name, err, errdefs.ErrCorrupt)
	}
	if err := sb.Validate(); err != nil {
		return nil, fmt.Errorf("object %s: %v: %w", name, err, errdefs.ErrCorrupt)
	}
	if want := SandboxObject(sb.Key()); name != want {
		return nil, fmt.Errorf("object %s: describes sandbox %s, which is stored as %s: %w", name, sb.Name, want, errdefs.ErrCorrupt)
	}
	return &sb, nil
}
