package overlay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
)

// CreateWith lays out and mounts a new root in dir on lower dir base, as
// Create does, but its writable layer is made by fill in upper (a fresh
// generation gen) instead of materialised from a tree: lazy restore writes
// placeholders there (overlay/lazy). The layer is not verified here, since
// it is not whole yet: whoever fills it verifies it once it is.
func (b *Backend) CreateWith(ctx context.Context, dir, base string, fill func(ctx context.Context, gen, upper string) error) (rootfs.Root, error) {
	r := b.root(dir, base)
	if err := checkOptionPath(base); err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("sandbox dir %s: %w", dir, errdefs.ErrExists)
		}
		return nil, fmt.Errorf("sandbox dir: %w", err)
	}
	fail := func(err error) (rootfs.Root, error) {
		_ = os.RemoveAll(dir) // nothing is mounted yet: a failed create leaves nothing
		return nil, err
	}
	if err := os.Mkdir(filepath.Join(dir, "root"), 0o755); err != nil {
		return fail(fmt.Errorf("sandbox dir: %w", err))
	}
	g, err := os.MkdirTemp(dir, "gen-")
	if err != nil {
		return fail(fmt.Errorf("sandbox %s: %w", dir, err))
	}
	upper := filepath.Join(g, "upper")
	if err := os.Mkdir(upper, 0o755); err != nil {
		return fail(fmt.Errorf("sandbox %s: %w", dir, err))
	}
	if err := os.Mkdir(filepath.Join(g, "work"), 0o700); err != nil {
		return fail(fmt.Errorf("sandbox %s: %w", dir, err))
	}
	if err := fill(ctx, g, upper); err != nil {
		return fail(err)
	}
	if err := r.switchTo(g); err != nil {
		return fail(err)
	}
	if err := r.Mount(ctx); err != nil {
		return fail(err)
	}
	return r, nil
}

// LiveLayer returns the directory of the live generation of the root in
// dir and its upper directory.
func LiveLayer(dir string) (gen, upper string, err error) {
	g, err := Open(dir, "").gen()
	if err != nil {
		return "", "", err
	}
	return g, filepath.Join(g, "upper"), nil
}
