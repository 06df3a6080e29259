package overlay

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
)

// Backend creates overlay roots. Bases are materialised once per host under
// one directory and shared read-only by every sandbox on them.
type Backend struct {
	bases string
}

// NewBackend returns a backend keeping materialised bases in basesDir.
func NewBackend(basesDir string) *Backend { return &Backend{bases: basesDir} }

// Name is "overlay".
func (b *Backend) Name() string { return Name }

// PrepareBase returns the lower dir holding base tree, materialising it
// unless this host has it already. It is verified before it is published by
// a rename, so a lower dir that exists is always complete.
func (b *Backend) PrepareBase(ctx context.Context, tree delta.ID, loader delta.BlobLoader) (string, error) {
	dst := filepath.Join(b.bases, tree.String())
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	if err := os.MkdirAll(b.bases, 0o700); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(b.bases, ".tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	// The base is the operator's own image, so its device nodes are allowed.
	if _, err := delta.Materialise(ctx, tree, tmp, delta.ApplyOptions{Loader: loader, AllowDevices: true}); err != nil {
		return "", fmt.Errorf("base %s: %w", tree.Short(), err)
	}
	res, err := delta.Scan(ctx, tmp, delta.ScanOptions{})
	if err != nil {
		return "", err
	}
	if res.Root != tree {
		return "", fmt.Errorf("base %s: materialised copy hashes to %s: %w", tree.Short(), res.Root.Short(), errdefs.ErrCorrupt)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", fmt.Errorf("base %s: %w", tree.Short(), err)
	}
	return dst, nil
}

// Create lays out and mounts a new root in dir on lower dir base (see
// rootfs.Backend).
func (b *Backend) Create(ctx context.Context, dir, base string, tree delta.ID, loader delta.BlobLoader) (rootfs.Root, error) {
	r, err := Create(ctx, dir, base, tree, loader)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Open returns the root kept in dir without touching it.
func (b *Backend) Open(dir, base string) rootfs.Root { return Open(dir, base) }

var _ rootfs.Backend = (*Backend)(nil)
