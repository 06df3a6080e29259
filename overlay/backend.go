package overlay

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"github.com/turnsnap/turnsnap/overlay/frozen"
)

// Backend creates overlay roots. Bases are materialised once per host under
// one directory and shared read-only by every sandbox on them.
type Backend struct {
	bases string
	// loader reads the trees a stacked root composes its scans onto
	// (SetLoader); layers are the frozen layers roots stack on, keeper
	// their policy (freezer.go; nil until SetFreezing: none kept).
	loader func() delta.BlobLoader
	layers *frozen.Layers
	keeper *frozen.Keeper
	keys   keyCache
	memo   *cacheMemo // decoded scan caches of its roots (cachememo.go)
	links  linkMemo   // hardlink groups of the lowers its roots sit on (linkmemo.go)
	ids    delta.IDs  // the home's content ID scheme (SetIDs)
	track  trackers   // change tracking (turnscan.go)
	// watches stand in for CheckBase's walk while nothing below a base
	// changed (basecheck.go).
	watches baseWatches
	// rebuildRestores: restores rebuild the layer (SetRebuildRestores).
	rebuildRestores atomic.Bool
}

// NewBackend returns a backend keeping materialised bases (and frozen
// layers) in basesDir.
func NewBackend(basesDir string) *Backend {
	return &Backend{bases: basesDir, memo: newCacheMemo(), layers: frozen.NewLayers(basesDir, Translate)}
}

// SetIDs sets the content ID scheme the backend's scans and checks use
// (default: plain BLAKE3). Call it before the backend is used.
func (b *Backend) SetIDs(ids delta.IDs) {
	b.ids = ids
	b.layers.SetIDs(ids)
}

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
	if _, err := fstree.Materialise(ctx, tree, tmp, fstree.ApplyOptions{Loader: loader, IDs: b.ids, AllowDevices: true, Plain: true, Workers: fstree.ParallelWorkers()}); err != nil {
		return "", fmt.Errorf("base %s: %w", tree.Short(), err)
	}
	res, err := fstree.Scan(ctx, tmp, fstree.ScanOptions{IDs: b.ids, Quiescent: true})
	if err != nil {
		return "", err
	}
	if res.Root != tree {
		return "", fmt.Errorf("base %s: materialised copy hashes to %s: %w", tree.Short(), res.Root.Short(), errdefs.ErrCorrupt)
	}
	// The scan cache lets CheckBase re-hash only what changed since.
	if err := b.saveBaseCache(tree, res.Cache); err != nil {
		return "", err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", fmt.Errorf("base %s: %w", tree.Short(), err)
	}
	return dst, nil
}

func (b *Backend) baseCache(tree delta.ID) string {
	return filepath.Join(b.bases, "."+tree.String()+".scan")
}

func (b *Backend) saveBaseCache(tree delta.ID, c *fstree.ScanCache) error {
	return writeCacheFile(b.baseCache(tree), func(w *bufio.Writer) error { return fstree.WriteCache(w, c) })
}

// CheckBase re-hashes the base tree materialised on this host, if any, and
// reports whether there was one. A base is shared read-only by every
// sandbox on it, so a damaged one would spread into every branch. full
// re-reads every file (verify); otherwise files whose inode, size, mtime
// and ctime match the scan made when the base was materialised are trusted,
// which costs one stat per entry (restores), or nothing while a watch
// armed before the last such check saw no change below the base
// (basecheck.go).
func (b *Backend) CheckBase(ctx context.Context, tree delta.ID, full bool) (bool, error) {
	dst := filepath.Join(b.bases, tree.String())
	if _, err := os.Stat(dst); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	if full {
		return true, b.checkBase(ctx, tree, dst, true)
	}
	if b.watches.clean(tree, time.Now()) {
		return true, nil
	}
	w := b.watches.arm(ctx, dst)
	err := b.checkBase(ctx, tree, dst, false)
	b.watches.keep(tree, w, err == nil)
	return true, err
}

// checkBase is CheckBase's look at the base materialised at dst.
func (b *Backend) checkBase(ctx context.Context, tree delta.ID, dst string, full bool) error {
	var prev *fstree.ScanCache
	if !full {
		prev = b.memo.read(b.baseCache(tree)) // unreadable: nil, a full scan
		// The cache is the scan of the base that hashed to tree (saved
		// only after that check): a base that still lists the same names
		// and stats to the same keys would scan to the same trees
		// (delta's Unchanged says why), so it is checked without building
		// them. Anything else is scanned, and refused if it differs.
		if prev.Unchanged(ctx, dst) {
			return nil
		}
	}
	res, err := fstree.Scan(ctx, dst, fstree.ScanOptions{IDs: b.ids, Prev: prev, Quiescent: true})
	if err != nil {
		return fmt.Errorf("base %s: %w", dst, err)
	}
	if res.Root != tree {
		return fmt.Errorf("base %s: materialised copy hashes to %s, not its tree (move it away to restore it from the store): %w",
			dst, res.Root.Short(), errdefs.ErrCorrupt)
	}
	if prev == nil && !full {
		return b.saveBaseCache(tree, res.Cache)
	}
	return nil
}

// Create lays out and mounts a new root in dir on lower dir base (see
// rootfs.Backend).
func (b *Backend) Create(ctx context.Context, dir, base string, tree delta.ID, loader delta.BlobLoader) (rootfs.Root, error) {
	r, err := create(ctx, b.root(dir, base), tree, loader)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Open returns the root kept in dir without touching it.
func (b *Backend) Open(dir, base string) rootfs.Root { return b.root(dir, base) }

// root is Open of the backend's root in dir: it shares the backend's
// loader, caches and ID scheme.
func (b *Backend) root(dir, base string) *Root {
	r := Open(dir, base)
	r.loader, r.keys = b.loader, &b.keys
	r.memo, r.links = b.memo, &b.links
	r.ids = b.ids
	r.rebuildAll = &b.rebuildRestores
	return r
}

// SetRebuildRestores makes its roots' restores rebuild the whole layer, as
// they did before restores by diff: the baseline the rollback benchmarks
// measure the diff path against. A method, not an environment variable, so
// nothing outside the program can switch a production daemon's restores.
func (b *Backend) SetRebuildRestores(on bool) { b.rebuildRestores.Store(on) }

var _ rootfs.Backend = (*Backend)(nil)
