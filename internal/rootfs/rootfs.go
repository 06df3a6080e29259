// Package rootfs defines a sandbox's root filesystem as the engine drives it:
// the Root and Backend interfaces that package overlay and package btrfs
// implement and internal/roottest checks, and the optional interfaces a
// backend may implement besides (optional.go). It imports only the format.
package rootfs

import (
	"context"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
)

// Root is one sandbox's root filesystem. Every
// backend's roots behave alike (one conformance suite runs against each):
//
//   - The state of a root is its base plus a writable layer. Scan returns the
//     writable layer as a tree in overlay upper form relative to the base:
//     new and changed entries in full, deletions as whiteouts, directories
//     that replace a base directory opaque. So records mean the same thing
//     whatever backend took them, and any backend can restore any record.
//   - Scan reads only what changed since the last Committed scan; Committed
//     is called once the checkpoint holding that scan is durable.
//   - Restore makes the root exactly base + tree, verifies it, and leaves it
//     mounted. A crash or an error midway leaves either the old state or
//     the new one, or (an error wrapping fstree.ErrPartial; a crash after
//     the first write) a state from which Restore of the same tree
//     finishes the job: callers that must not leave a mix record their
//     intent first (the engine's rollback intent) and call Restore again.
//   - Mount is idempotent and brings a root back after a reboot.
type Root interface {
	Path() string
	Mount(ctx context.Context) error
	Unmount(ctx context.Context) error
	Remove(ctx context.Context) error
	Scan(ctx context.Context, saver delta.BlobSaver) (*fstree.ScanResult, error)
	Committed(res *fstree.ScanResult) error
	Restore(ctx context.Context, tree delta.ID, loader delta.BlobLoader) error
}

// Backend makes roots of one kind. A backend that needs settings (the btrfs
// pool) is made per sandbox from its typed options, which the sandbox object
// keeps as JSON (delta.Sandbox.Config).
type Backend interface {
	Name() string
	// PrepareBase makes base tree available to roots on this host (once per
	// host and base) and returns where it lives.
	PrepareBase(ctx context.Context, tree delta.ID, loader delta.BlobLoader) (string, error)
	// Create lays out a new root in dir (which must not exist) on the
	// prepared base, with tree as its writable layer, and mounts it.
	Create(ctx context.Context, dir, base string, tree delta.ID, loader delta.BlobLoader) (Root, error)
	// Open returns the root kept in dir without touching it.
	Open(dir, base string) Root
}

type phaseKey struct{}

// WithPhase returns ctx carrying f, which Phase calls as a restore reaches
// a named step (tests kill the process there).
func WithPhase(ctx context.Context, f func(string)) context.Context {
	return context.WithValue(ctx, phaseKey{}, f)
}

// Phase reports reaching step name to the function WithPhase put in ctx.
func Phase(ctx context.Context, name string) {
	if f, ok := ctx.Value(phaseKey{}).(func(string)); ok && f != nil {
		f(name)
	}
}
