package delta

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Ownership of a sandbox on a shared bucket (docs/STORAGE.md, "Ownership
// and fencing"). Exactly one home writes a sandbox's head at a time. The
// bucket's head object carries its writer: the owner's home id and an
// epoch. Every head write is conditional on the ETag the writer last saw
// (S3 If-Match, or If-None-Match for the first), so a writer whose view is
// stale is refused by the bucket itself; `sandbox adopt` takes a sandbox
// over by rewriting its head with the next epoch, which changes the ETag
// and so fences the old owner. This is SlateDB's manifest epoch, with the
// head as the manifest.

// Owner names the home that may write a sandbox's head, and the epoch of
// its ownership. The zero Owner is a head written before ownership existed
// (or by a home that never pushed it): its owner is the home named in the
// sandbox's description, epoch 0.
type Owner struct {
	Home  string `json:"home"`  // a home id (ValidSandboxID)
	Epoch uint64 `json:"epoch"` // 1 for the creating home; +1 at each adoption
}

// IsZero reports whether o names no owner.
func (o Owner) IsZero() bool { return o.Home == "" && o.Epoch == 0 }

func (o Owner) String() string {
	if o.IsZero() {
		return "no owner line"
	}
	return fmt.Sprintf("home %s epoch %d", o.Home, o.Epoch)
}

// EncodeHead is the content of a head object in a shared bucket: the
// target's hex ID and a newline, then, when o is set, the line
// "owner <home id> <epoch>". Without an owner it equals EncodeRef.
func EncodeHead(id ID, o Owner) []byte {
	if o.IsZero() {
		return EncodeRef(id)
	}
	return []byte(fmt.Sprintf("%s\nowner %s %d\n", id, o.Home, o.Epoch))
}

// ParseHead parses a ref object that may carry an owner line (heads do
// once pushed; tags never do). Anything else than the two forms
// EncodeHead writes is ErrCorrupt.
func ParseHead(data []byte) (ID, Owner, error) {
	if len(data) > MaxSmallObject {
		return ID{}, Owner{}, fmt.Errorf("ref of %d bytes, at most %d: %w", len(data), MaxSmallObject, errdefs.ErrCorrupt)
	}
	first, rest, _ := bytes.Cut(data, []byte("\n"))
	id, err := ParseID(strings.TrimSpace(string(first)))
	if err != nil {
		return ID{}, Owner{}, fmt.Errorf("ref target: %w", errdefs.ErrCorrupt)
	}
	rest = bytes.TrimRight(rest, "\n")
	if len(rest) == 0 {
		return id, Owner{}, nil
	}
	f := strings.Fields(string(rest))
	if len(f) != 3 || f[0] != "owner" || !ValidSandboxID(f[1]) {
		return ID{}, Owner{}, fmt.Errorf("ref owner line %q: %w", truncate(string(rest), 80), errdefs.ErrCorrupt)
	}
	ep, err := strconv.ParseUint(f[2], 10, 63)
	if err != nil || ep == 0 || f[2] != strconv.FormatUint(ep, 10) {
		return ID{}, Owner{}, fmt.Errorf("ref owner epoch %q: %w", truncate(f[2], 24), errdefs.ErrCorrupt)
	}
	return id, Owner{Home: f[1], Epoch: ep}, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// HostPrefix starts host lease objects: HostPrefix || home id, holding a
// HostLease.
const HostPrefix = "hosts/"

// HostLeaseName is the store name of a home's lease.
func HostLeaseName(home string) string { return HostPrefix + home }

// HostLease is the JSON content of a host lease object: a daemon serving
// the home says it is alive by rewriting it every TTL/3. A sandbox whose
// owner's lease is live is not adopted without force: its owner is
// working, and adopting fences it.
type HostLease struct {
	Home    string    `json:"home"`
	Host    string    `json:"host"`
	BootID  string    `json:"boot_id,omitempty"`
	PID     int       `json:"pid"`
	Renewed time.Time `json:"renewed"`
	TTLNs   int64     `json:"ttl_ns"`
}

// DefaultLeaseTTL is how long a host lease stays live without renewal. The
// daemon renews every third of it, so three PUTs a minute per host.
const DefaultLeaseTTL = 60 * time.Second

// Live reports whether the lease was renewed within its TTL at now;
// modTime is the store's modification time of the object (the later of the
// two counts, as for locks).
func (l *HostLease) Live(modTime, now time.Time) bool {
	last := l.Renewed
	if modTime.After(last) {
		last = modTime
	}
	ttl := time.Duration(l.TTLNs)
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	return now.Sub(last) <= ttl
}
