package rebuild

import "time"

// Report counts what a catalog rebuild found in the store and names
// what it left out.
type Report struct {
	Packs       int
	Blobs       int
	Checkpoints int
	Sandboxes   int
	Refs        int
	Duration    time.Duration
	// Skipped lists every object the rebuild left out, each with the class
	// of its fault. The rebuild is partial when it is not empty: everything
	// else (every sandbox and checkpoint that is whole) was restored.
	Skipped []SkippedObject
	// Corrupt is the part of Skipped whose class is SkipCorrupt, as it was
	// reported before Skipped existed.
	Corrupt []CorruptObject
}

// Partial says whether the rebuild left anything out.
func (r *Report) Partial() bool { return len(r.Skipped) > 0 }

// SkipClass is why a rebuild left an object out.
type SkipClass string

const (
	// SkipDangling: a head or tag names a checkpoint the store lacks (a
	// prune on another home deleted it, or the ref was never valid).
	SkipDangling SkipClass = "dangling"
	// SkipMissingObjects: an object is readable but something it needs is
	// in no pack (a record whose trees or chunks are gone), or a ref names
	// such a record, or a sandbox description has no head.
	SkipMissingObjects SkipClass = "missing_objects"
	// SkipCorrupt: the object does not decode, breaks a rule of the format
	// (a bad pack header, a declared size over a limit, a wrong hash, a
	// record or head that contradicts its sandbox), or names an object that
	// does.
	SkipCorrupt SkipClass = "corrupt"
)

// SkippedObject is one object a rebuild left out.
type SkippedObject struct {
	Name  string    `json:"name"` // the store object, as named in the store
	Class SkipClass `json:"class"`
	// Sandbox is the label (on the home that wrote it) of the sandbox the
	// object belongs to, when the rebuild could tell.
	Sandbox string `json:"sandbox,omitempty"`
	Error   string `json:"error"`
}

// Options configures a catalog rebuild.
type Options struct {
	// SkipCorrupt is what a rebuild does anyway (skip each object it cannot
	// use and report it); it stays for callers written when failing was
	// the default.
	SkipCorrupt bool
	// Strict fails the rebuild at the first object it would skip, naming it
	// (ErrCorrupt), and keeps the old catalog.
	Strict bool
}

// CorruptObject is an object a rebuild could not use.
type CorruptObject struct {
	Name  string `json:"name"`
	Error string `json:"error"`
}
