// Package retention deletes what a home no longer keeps: checkpoints past a
// retention policy (prune, forget, stored policies) and the packs no
// checkpoint references (gc). On a home with a remote it deletes records in
// two phases (mark, grace, sweep: marks.go), since another home sharing the
// bucket may name any checkpoint it can see.
//
// The engine composes it: Deps says what retention needs from the engine
// (its locks, its history, its stores), and the engine keeps one
// *Retention for its whole life.
package retention

import (
	"context"
	"log/slog"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/upload"
)

// Parts are the engine's parts retention works on. The engine replaces
// them under its exclusive lock (a remote set up, keys changed, a catalog
// rebuilt), so an operation asks for them once it holds a lock, and never
// keeps them.
type Parts struct {
	// HomeID is this home's id: the name of its mark object, and the home
	// a bucket's owner lines name when a sandbox is this home's.
	HomeID  string
	Catalog *catalog.Catalog
	// Store is Local, or Local in front of Remote: what gc marks from.
	Store upload.Store
	Local upload.Store
	// Remote is the bucket; nil without a remote.
	Remote upload.Store
	// Blobs loads trees and chunk lists (a deleted checkpoint's roots
	// release what they counted).
	Blobs delta.BlobLoader
}

// BucketLock is a lock on the bucket held by this host (the engine's
// remote.Lock): a lost lock cancels the context it gives.
type BucketLock interface {
	Context(parent context.Context) (context.Context, context.CancelFunc)
	Release(ctx context.Context)
}

// Deps is what retention needs from the engine that opened it.
type Deps struct {
	// Home is the home directory, which holds retention.json.
	Home string
	Log  *slog.Logger
	// Parts gives the engine's parts as they are now (see Parts).
	Parts func() Parts
	// Exclusive and Shared take the engine's home-wide locks: every prune,
	// forget, policy change and gc holds Exclusive (nothing else runs
	// meanwhile); reading policies holds Shared.
	Exclusive func() (done func())
	Shared    func() (done func())
	// LoadHistory reads every checkpoint in the catalog by sandbox, with
	// what this home pins and owns (the engine knows its catalog's graph).
	LoadHistory func(ctx context.Context) (*History, error)
	// DropFrozen runs the frozen layers' retention after checkpoints or
	// packs were deleted; it only logs failures.
	DropFrozen func(ctx context.Context)
	// LockBucket takes the bucket's named lock ("gc"); errdefs.ErrUnavailable
	// when another host holds it. Called only with a remote.
	LockBucket func(ctx context.Context, name string) (BucketLock, error)
	// ReadPackHeader reads a pack's header, locally or from the bucket.
	ReadPackHeader func(ctx context.Context, name string) ([]delta.PackEntry, error)
	// LoaderFor reads blobs through locs instead of the catalog's index.
	LoaderFor func(locs map[delta.ID]catalog.BlobLocation) delta.BlobLoader
	// ProgressPhase shows the step under way; Phase reports reaching a
	// named phase (PhaseGCLocked) to tests. Either may be nil.
	ProgressPhase func(name string, total int64)
	Phase         func(name string)
}

// Retention carries out a home's retention. Its methods take the engine's
// locks themselves.
type Retention struct {
	d Deps
}

// New makes the retention of a home.
func New(d Deps) *Retention {
	if d.Log == nil {
		d.Log = slog.Default()
	}
	if d.ProgressPhase == nil {
		d.ProgressPhase = func(string, int64) {}
	}
	if d.Phase == nil {
		d.Phase = func(string) {}
	}
	return &Retention{d: d}
}

// op is one operation's view: the engine's parts as they were when it took
// its lock.
type op struct {
	*Retention
	Parts
}

func (rt *Retention) op() *op { return &op{Retention: rt, Parts: rt.d.Parts()} }

// History is what prune and forget decide from: every checkpoint by
// sandbox, which sandboxes this home may prune, and what is pinned. The
// engine builds it from its catalog (Deps.LoadHistory).
type History struct {
	Pin       Pins                           // heads, tags, branch points: never deleted
	Tags      map[delta.ID][]string          // checkpoint -> its tags
	Owned     map[string]bool                // sandbox keys whose checkpoints this home may delete
	Known     map[string]bool                // every sandbox key the catalog has
	Names     map[string]string              // sandbox key -> live label
	Keys      map[string]string              // live label -> sandbox key
	BySandbox map[string][]*delta.Checkpoint // sandbox key -> its checkpoints
}

// NewHistory is an empty History, every map made.
func NewHistory() *History {
	return &History{Pin: Pins{}, Tags: map[delta.ID][]string{}, Owned: map[string]bool{}, Known: map[string]bool{},
		Names: map[string]string{}, Keys: map[string]string{}, BySandbox: map[string][]*delta.Checkpoint{}}
}

// mayPrune reports whether this home may delete the checkpoints of the
// sandbox with this key: one it created (live or removed since), or a
// legacy one. Another home's sandbox, and records of an id'd sandbox this
// catalog does not know, are left alone.
func (h *History) mayPrune(key string) bool {
	cps := h.BySandbox[key]
	return h.Owned[key] || (!h.Known[key] && (len(cps) == 0 || cps[0].SandboxID == ""))
}

func (h *History) label(cp *delta.Checkpoint) string {
	if n, ok := h.Names[string(cp.SandboxKey())]; ok {
		return n
	}
	return string(cp.Sandbox)
}
