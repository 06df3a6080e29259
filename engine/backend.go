package engine

import (
	"context"
	"fmt"

	"github.com/turnsnap/turnsnap/btrfs"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/overlay"
)

// Root is one sandbox's root filesystem as the engine drives it. Every
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
//     mounted; a crash midway leaves the old state or the new one.
//   - Mount is idempotent and brings a root back after a reboot.
type Root interface {
	Path() string
	Mount(ctx context.Context) error
	Unmount(ctx context.Context) error
	Remove(ctx context.Context) error
	Scan(ctx context.Context, saver delta.BlobSaver) (*delta.ScanResult, error)
	Committed(res *delta.ScanResult) error
	Restore(ctx context.Context, tree delta.ID, loader delta.BlobLoader) error
}

// Backend makes roots of one kind. A backend that needs settings (the btrfs
// pool) is made per sandbox from catalog.Sandbox.Config; see Engine.backend.
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

// overlayBackend adapts package overlay's concrete types to Backend.
type overlayBackend struct{ *overlay.Backend }

func (b overlayBackend) Create(ctx context.Context, dir, base string, tree delta.ID, loader delta.BlobLoader) (Root, error) {
	r, err := overlay.Create(ctx, dir, base, tree, loader)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (b overlayBackend) Open(dir, base string) Root { return overlay.Open(dir, base) }

// backend returns the backend called name configured by a sandbox's
// settings cfg (nil for none). Backends without settings are made once, at
// Open; the others are made here, which also checks their settings.
func (e *Engine) backend(name string, cfg map[string]string) (Backend, error) {
	if b, ok := e.backends[name]; ok {
		return b, nil
	}
	if name == btrfs.Name {
		return e.btrfsBackend(cfg)
	}
	have := []string{btrfs.Name}
	for n := range e.backends {
		have = append(have, n)
	}
	return nil, fmt.Errorf("backend %q is not available (have: %v): %w", name, have, errdefs.ErrInvalid)
}
