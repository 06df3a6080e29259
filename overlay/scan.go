package overlay

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"os"
	"path/filepath"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

// overlayXattrPrefix marks overlayfs's own bookkeeping on upper entries.
const overlayXattrPrefix = "trusted.overlay."

// RedirectXattr marks an upper directory that was renamed from a lower
// one (redirect_dir=on): its value is the lower path, and the upper holds
// only what changed below it.
const RedirectXattr = "trusted.overlay.redirect"

const (
	metacopyXattr = "trusted.overlay.metacopy"
	originXattr   = "trusted.overlay.origin"
)

// Scan derives the tree of the upper layer, reading only what changed since
// the last committed checkpoint. saver may be nil (hash only). The root
// must be mounted: renamed base directories are read through the mount.
func (r *Root) Scan(ctx context.Context, saver delta.BlobSaver) (*fstree.ScanResult, error) {
	g, err := r.gen()
	if err != nil {
		return nil, err
	}
	if err := r.linkUp(g); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", r.dir, err)
	}
	prev := r.memo.read(filepath.Join(g, "scan.cache"))
	if s, err := readStack(g); err != nil || s != nil {
		if err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", r.dir, err)
		}
		return r.scanStacked(ctx, g, s, saver, prev, nil)
	}
	return r.scanUpper(ctx, filepath.Join(g, "upper"), saver, prev, fstree.ScanOptions{})
}

// scanUpper scans an upper directory; opts may set Quiescent.
func (r *Root) scanUpper(ctx context.Context, upper string, saver delta.BlobSaver, prev *fstree.ScanCache, opts fstree.ScanOptions) (*fstree.ScanResult, error) {
	res, _, err := r.scanUpperR(ctx, upper, saver, prev, opts)
	return res, err
}

// scanUpperR is scanUpper that also reports whether a renamed base
// directory was listed through the mount.
func (r *Root) scanUpperR(ctx context.Context, upper string, saver delta.BlobSaver, prev *fstree.ScanCache, opts fstree.ScanOptions) (*fstree.ScanResult, bool, error) {
	u, err := r.newUpperScan()
	if err != nil {
		return nil, false, err
	}
	defer u.close()
	opts.Prev, opts.Translate, opts.Residue, opts.Redirect = prev, Translate, u.residue, u.redirect
	opts.IDs = r.ids
	var trees *treeBuffer
	if saver != nil {
		trees = &treeBuffer{next: saver}
		opts.Saver = trees
	}
	res, err := fstree.Scan(ctx, upper, opts)
	if err == nil && u.mountFD >= 0 {
		// A renamed directory was listed through the mount, where inode
		// numbers are the mount's: walk again (from the cache: nothing is
		// read twice) matching hardlinks by those numbers everywhere, so a
		// file linked across the renamed directory's edge stays linked.
		// The first walk's trees are dropped unsaved.
		first := res
		opts.LinkID, opts.Prev, opts.Saver = u.linkID, first.Cache, saver
		trees = nil
		if res, err = fstree.Scan(ctx, upper, opts); err == nil {
			res.Stats.FilesRead += first.Stats.FilesRead
			res.Stats.BytesRead += first.Stats.BytesRead
			res.Stats.Chunks += first.Stats.Chunks
		}
	}
	if err == nil && trees != nil {
		err = trees.flush(ctx)
	}
	if err != nil {
		return nil, false, fmt.Errorf("sandbox %s: %w", r.dir, err)
	}
	return res, u.mountFD >= 0, nil
}

// Committed records res as the state of the last committed checkpoint, so
// the next scan reads only what changed after it. Call it only once the
// checkpoint that res describes is committed: the cache names chunks as
// stored.
func (r *Root) Committed(res *fstree.ScanResult) error {
	g, err := r.gen()
	if err != nil {
		return err
	}
	p := filepath.Join(g, "scan.cache")
	err = writeCacheFile(p, func(w *bufio.Writer) error {
		return fstree.WriteCache(w, res.Cache)
	})
	if err != nil {
		return fmt.Errorf("sandbox %s: save scan cache: %w", r.dir, err)
	}
	r.memo.wrote(p, res.Cache)
	return nil
}

// readCache loads a scan cache; any problem just means a full read.
func readCache(p string) *fstree.ScanCache {
	f, err := os.Open(p)
	if err != nil {
		return nil
	}
	defer f.Close()
	c, err := fstree.ReadCache(bufio.NewReader(f))
	if err != nil {
		return nil
	}
	return c
}

// Translate maps an upper-dir entry to its meaning in the tree format: a
// 0:0 character device is a whiteout, trusted.overlay.opaque=y makes an
// opaque directory, and overlay's other trusted.overlay.* attributes (origin,
// impure, redirect, ...) are kernel bookkeeping and dropped. A metacopy
// stub (data still in the lower file) is refused: roots mount with
// metacopy=off, so one means the layer was written under other options. It
// is idempotent, as fstree.ScanOptions requires.
func Translate(rel string, _ *unix.Stat_t, e *delta.Entry) (bool, error) {
	if e.Type == delta.TypeCharDev && e.Rdev == 0 {
		*e = delta.Entry{Name: e.Name, Type: delta.TypeWhiteout}
		return true, nil
	}
	kept := e.Xattrs[:0]
	for _, x := range e.Xattrs {
		switch {
		case x.Name == fstree.OpaqueXattr:
			e.Opaque = e.Type == delta.TypeDir && string(x.Value) == "y"
			continue
		case x.Name == metacopyXattr || (x.Name == RedirectXattr && e.Type != delta.TypeDir):
			return false, fmt.Errorf("upper entry %s is a metacopy stub (%s), which a root mounted with metacopy=off never writes: %w",
				rel, x.Name, errdefs.ErrPrecondition)
		case strings.HasPrefix(x.Name, overlayXattrPrefix):
			continue
		}
		kept = append(kept, x)
	}
	e.Xattrs = kept
	if len(e.Xattrs) == 0 {
		e.Xattrs = nil
	}
	return true, nil
}

// rebuild replaces the writable layer by tree, whole (Restore's fallback).
// The new layer is built and verified beside the live one while the root
// stays mounted and untouched; only then is the root unmounted, switched
// with one rename and mounted again, so a failed rebuild (a full disk, a
// corrupt object) leaves the live root exactly as it was, and a killed one
// leaves the old layer or the new one, never a mix.
func (r *Root) rebuild(ctx context.Context, tree delta.ID, loader delta.BlobLoader) error {
	g, err := r.build(ctx, tree, loader)
	if err != nil {
		return err
	}
	if err := r.Unmount(ctx); err != nil {
		os.RemoveAll(g)
		return err
	}
	if err := r.switchTo(g); err != nil {
		os.RemoveAll(g)
		if merr := r.Mount(ctx); merr != nil {
			return errors.Join(err, merr)
		}
		return err
	}
	return r.Mount(ctx)
}

// install materialises tree as a new generation and makes it current.
func (r *Root) install(ctx context.Context, tree delta.ID, loader delta.BlobLoader) error {
	g, err := r.build(ctx, tree, loader)
	if err != nil {
		return err
	}
	if err := r.switchTo(g); err != nil {
		os.RemoveAll(g)
		return err
	}
	return nil
}

// build materialises tree as a new, verified generation that is not yet
// current, and returns its directory.
func (r *Root) build(ctx context.Context, tree delta.ID, loader delta.BlobLoader) (string, error) {
	g, err := os.MkdirTemp(r.dir, "gen-")
	if err != nil {
		return "", fmt.Errorf("sandbox %s: %w", r.dir, err)
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(g)
		}
	}()
	upper := filepath.Join(g, "upper")
	if err := os.Mkdir(upper, 0o755); err != nil {
		return "", fmt.Errorf("sandbox %s: %w", r.dir, err)
	}
	if err := os.Mkdir(filepath.Join(g, "work"), 0o700); err != nil {
		return "", fmt.Errorf("sandbox %s: %w", r.dir, err)
	}
	if _, err := fstree.Materialise(ctx, tree, upper, fstree.ApplyOptions{Loader: loader, IDs: r.ids}); err != nil {
		return "", fmt.Errorf("sandbox %s: restore tree %s: %w", r.dir, tree.Short(), err)
	}
	if err := syncFS(upper); err != nil {
		return "", fmt.Errorf("sandbox %s: sync: %w", r.dir, err)
	}
	// What was written must hash back to what was asked for. The scan
	// doubles as the new generation's cache, so the first checkpoint after a
	// restore reads nothing it does not have to.
	res, err := r.scanUpper(ctx, upper, nil, nil, fstree.ScanOptions{Quiescent: true})
	if err != nil {
		return "", err
	}
	if res.Root != tree {
		return "", fmt.Errorf("sandbox %s: restored layer hashes to %s, checkpoint tree is %s: %w",
			r.dir, res.Root.Short(), tree.Short(), errdefs.ErrCorrupt)
	}
	if err := writeCacheFile(filepath.Join(g, "scan.cache"), func(w *bufio.Writer) error {
		return fstree.WriteCache(w, res.Cache)
	}); err != nil {
		return "", fmt.Errorf("sandbox %s: save scan cache: %w", r.dir, err)
	}
	ok = true
	return g, nil
}

// switchTo makes generation g current with one rename and removes the old.
func (r *Root) switchTo(g string) error {
	old, _ := r.gen()
	tmp := filepath.Join(r.dir, "current.new")
	os.Remove(tmp)
	if err := os.Symlink(filepath.Base(g), tmp); err != nil {
		return fmt.Errorf("sandbox %s: %w", r.dir, err)
	}
	if err := os.Rename(tmp, filepath.Join(r.dir, "current")); err != nil {
		return fmt.Errorf("sandbox %s: switch layer: %w", r.dir, err)
	}
	if err := fsat.SyncDir(r.dir); err != nil {
		return fmt.Errorf("sandbox %s: sync: %w", r.dir, err)
	}
	if old != "" {
		os.RemoveAll(old)
	}
	return nil
}

func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// treeBuffer passes data blobs on and holds tree blobs until flush, so a
// walk whose trees turn out not to be the result stores none of them.
// Trees are small (tens of bytes per entry) and a scan writes each once.
type treeBuffer struct {
	next  delta.BlobSaver
	ids   []delta.ID
	trees [][]byte
}

func (b *treeBuffer) SaveBlob(ctx context.Context, t delta.BlobType, id delta.ID, data []byte) (bool, error) {
	if t != delta.BlobTree {
		return b.next.SaveBlob(ctx, t, id, data)
	}
	b.ids = append(b.ids, id)
	b.trees = append(b.trees, bytes.Clone(data))
	return true, nil
}

// PrepareBlob forwards the ingest pipeline's compression ahead of time
// (fstree.BlobPreparer).
func (b *treeBuffer) PrepareBlob(ctx context.Context, t delta.BlobType, id delta.ID, data []byte) {
	fstree.Prepare(ctx, b.next, t, id, data)
}

// flush saves the held trees in the order the walk made them (children
// before parents, as the write order wants).
func (b *treeBuffer) flush(ctx context.Context) error {
	for i, id := range b.ids {
		if _, err := b.next.SaveBlob(ctx, delta.BlobTree, id, b.trees[i]); err != nil {
			return fmt.Errorf("save tree %s: %w", id.Short(), err)
		}
	}
	return nil
}
