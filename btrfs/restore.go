package btrfs

import (
	"context"
	"errors"
	"fmt"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"os"
	"path/filepath"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Restore makes the root exactly base + tree and leaves it mounted. A local
// restore point of tree (this sandbox's, or another's in the pool) is
// snapshotted: no file is written. Without one, tree is applied from the
// store onto a fresh snapshot of the base and verified by re-deriving it.
// The new state is built as a new generation beside the live one and
// switched in with one rename, so a crash or an error leaves the old state.
func (r *Root) Restore(ctx context.Context, tree delta.ID, loader delta.BlobLoader) error {
	sbDir, err := r.sbDir()
	if err != nil {
		return err
	}
	if err := r.Unmount(ctx); err != nil {
		return err
	}
	if err := r.install(ctx, sbDir, tree, loader); err != nil {
		if merr := r.Mount(context.WithoutCancel(ctx)); merr != nil {
			return errors.Join(err, merr)
		}
		return err
	}
	return r.Mount(ctx)
}

// Restored returns the layer tree the live generation holds as its last
// restore left it: the tree a restore point's head names (checked against
// the tree asked for), or the layer a restore from the store re-derived
// by scanning what it wrote (equal to the tree asked for, or the same
// state: Restore checks). A restore receipt builds on it (engine).
func (r *Root) Restored() (delta.ID, error) {
	_, g, err := r.gen()
	if err != nil {
		return delta.ID{}, err
	}
	h, err := metaDir(filepath.Join(g, "meta")).readHead()
	if err != nil {
		return delta.ID{}, fmt.Errorf("sandbox %s: %w", r.dir, err)
	}
	return h.Root, nil
}

// install builds tree as a new generation and makes it the live one.
func (r *Root) install(ctx context.Context, sbDir string, tree delta.ID, loader delta.BlobLoader) error {
	g, err := os.MkdirTemp(sbDir, "gen-")
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", r.dir, err)
	}
	ok := false
	defer func() {
		if !ok {
			removeTree(g)
		}
	}()
	if err := r.build(ctx, sbDir, g, tree, loader); err != nil {
		return fmt.Errorf("sandbox %s: restore tree %s: %w", r.dir, tree.Short(), err)
	}
	old, _ := os.Readlink(filepath.Join(sbDir, "current"))
	tmp := filepath.Join(sbDir, "current.new")
	os.Remove(tmp)
	if err := os.Symlink(filepath.Base(g), tmp); err != nil {
		return fmt.Errorf("sandbox %s: %w", r.dir, err)
	}
	if err := os.Rename(tmp, filepath.Join(sbDir, "current")); err != nil {
		return fmt.Errorf("sandbox %s: switch generation: %w", r.dir, err)
	}
	ok = true
	if err := fsat.SyncDir(sbDir); err != nil {
		return fmt.Errorf("sandbox %s: sync: %w", r.dir, err)
	}
	if old != "" {
		if err := removeTree(filepath.Join(sbDir, old)); err != nil {
			r.b.opts.Logger.Warn("old btrfs generation not removed (removed at next mount)", "sandbox", r.dir, "err", err)
		}
	}
	return nil
}

// build makes g/live and g/meta hold tree.
func (r *Root) build(ctx context.Context, sbDir, g string, tree delta.ID, loader delta.BlobLoader) error {
	base, bi, err := r.baseDir(sbDir)
	if err != nil {
		return err
	}
	baseRoot := filepath.Join(base, "root")
	if tree == r.b.opts.IDs.EmptyTree() {
		return buildEmpty(r.b.opts.IDs, g, baseRoot, bi)
	}
	if pt, ok := r.findPoint(sbDir, tree, bi.Tree); ok {
		err := buildFromPoint(pt, g, tree)
		if err == nil {
			return nil
		}
		r.b.opts.Logger.Warn("btrfs restore point unusable, restoring from the store", "sandbox", r.dir, "point", pt, "err", err)
		if err := clearGen(g); err != nil {
			return err
		}
	}
	return r.buildFromStore(ctx, sbDir, g, baseRoot, bi, tree, loader)
}

func clearGen(g string) error {
	for _, sv := range []string{"live", "meta"} {
		if err := deleteSubvolume(filepath.Join(g, sv)); err != nil {
			return err
		}
	}
	return nil
}

// buildEmpty makes g a fresh snapshot of the base with an empty layer.
func buildEmpty(ids delta.IDs, g, baseRoot string, bi baseInfo) error {
	if err := snapshot(baseRoot, filepath.Join(g, "live"), false); err != nil {
		return err
	}
	if err := createSubvolume(filepath.Join(g, "meta")); err != nil {
		return err
	}
	si, err := getSubvolInfo(baseRoot)
	if err != nil {
		return err
	}
	h := emptyHead(ids, bi)
	h.Basis = uuidString(si.UUID)
	return metaDir(filepath.Join(g, "meta")).writeHead(h)
}

// buildFromPoint snapshots a restore point: O(1), no data copied.
func buildFromPoint(pt, g string, tree delta.ID) error {
	if err := snapshot(filepath.Join(pt, "root"), filepath.Join(g, "live"), false); err != nil {
		return err
	}
	if err := snapshot(filepath.Join(pt, "meta"), filepath.Join(g, "meta"), false); err != nil {
		return err
	}
	h, err := metaDir(filepath.Join(g, "meta")).readHead()
	if err != nil {
		return err
	}
	if h.Root != tree {
		return fmt.Errorf("restore point %s holds tree %s: %w", pt, h.Root.Short(), errdefs.ErrCorrupt)
	}
	return nil
}

// buildFromStore applies tree onto a fresh snapshot of the base, then
// verifies it by scanning it from the base state, which also yields the
// records for the next scan and a restore point for the next rollback.
func (r *Root) buildFromStore(ctx context.Context, sbDir, g, baseRoot string, bi baseInfo, tree delta.ID, loader delta.BlobLoader) error {
	if err := buildEmpty(r.b.opts.IDs, g, baseRoot, bi); err != nil {
		return err
	}
	live, meta := filepath.Join(g, "live"), metaDir(filepath.Join(g, "meta"))
	if _, err := fstree.ApplyLayer(ctx, tree, live, fstree.ApplyOptions{Loader: loader, IDs: r.b.opts.IDs}); err != nil {
		return err
	}
	dir, err := takeScanSnapshot(sbDir, live)
	if err != nil {
		return err
	}
	keep := false
	defer func() {
		if !keep {
			removeTree(dir)
		}
	}()
	st, err := r.scanOne(ctx, dir, baseRoot, bi, meta, emptyHead(r.b.opts.IDs, bi), true, nil)
	if err != nil {
		return err
	}
	if st.head.Root != tree {
		// Another backend's layer can describe the same state differently
		// (overlay breaks a base hardlink on copy-up; btrfs keeps the other
		// name's inode touched). Accept it only if the merged states agree.
		trees := map[delta.ID][]byte{}
		for k, rec := range st.staged.res.recs {
			trees[r.b.opts.IDs.Hash(rec.Tree)] = rec.Tree
			st.head.Pending = append(st.head.Pending, k)
		}
		if err := equivalent(ctx, memLoader{trees, loader}, bi.Tree, tree, st.head.Root); err != nil {
			return fmt.Errorf("restored layer hashes to %s, checkpoint tree is %s, and their states differ: %w",
				st.head.Root.Short(), tree.Short(), err)
		}
		r.b.opts.Logger.Info("btrfs restore re-derived an equivalent layer; the next checkpoint records it",
			"sandbox", r.dir, "tree", tree.Short(), "layer", st.head.Root.Short())
		return r.writeState(meta, st.staged)
	}
	if err := r.writeState(meta, st.staged); err != nil {
		return err
	}
	keep = true
	return r.keepPoint(sbDir, dir, string(meta), tree, bi.Tree)
}

// memLoader serves some trees from memory and the rest from next.
type memLoader struct {
	trees map[delta.ID][]byte
	next  delta.BlobLoader
}

func (m memLoader) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	if d, ok := m.trees[id]; ok && t == delta.BlobTree {
		return d, nil
	}
	return m.next.LoadBlob(ctx, t, id)
}
