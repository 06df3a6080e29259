package overlay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"golang.org/x/sys/unix"
)

// A stacked generation (docs/STORAGE.md, "Frozen layers") is a generation
// whose upper is empty at birth and sits on a frozen layer above the base:
// lowerdir=FROZEN:BASE. The generation's stack file names the layer and its
// tree. Its scans are composed onto that tree (compose.go), so a stacked
// root reports the same trees and state keys as a root whose upper holds
// the layer's copy: records, diffs and restores never know the difference.
//
// The stack is never deeper than one frozen layer: a checkpoint of a
// stacked root freezes its whole state as a new layer (sharing unchanged
// files with the one below by hardlink), so a branch of a branch of ...
// stacks on that one layer; the merge happens at freeze time, and a
// rollback builds a plain generation (Restore), which unstacks the root.

// MaxStackDepth is how many frozen layers a root stacks on its base: one
// (see above). A deeper stack would make every lookup walk every layer.
const MaxStackDepth = 1

const stackFileName = "stack"

// stack is a generation's stack file.
type stack struct {
	Frozen   string   `json:"frozen"`    // the frozen layer's directory
	Tree     delta.ID `json:"tree"`      // its tree (upper form over the base)
	StateKey delta.ID `json:"state_key"` // the tree's state key
}

// readStack reads generation g's stack file; nil for a plain generation.
func readStack(g string) (*stack, error) {
	data, err := os.ReadFile(filepath.Join(g, stackFileName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var s stack
	if len(data) > 1<<16 {
		return nil, fmt.Errorf("stack file of %s: %d bytes: %w", g, len(data), errdefs.ErrCorrupt)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil || s.Tree.IsZero() {
		return nil, fmt.Errorf("stack file of %s: %v: %w", g, err, errdefs.ErrCorrupt)
	}
	if err := checkOptionPath(s.Frozen); err != nil {
		return nil, fmt.Errorf("stack file of %s: %w", g, err)
	}
	return &s, nil
}

// lowers returns generation g's lower dirs, topmost first: its frozen
// layer, if it stacks on one, above the base. Each must exist.
func (r *Root) lowers(g string) ([]string, error) {
	s, err := readStack(g)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", r.dir, err)
	}
	lowers := []string{r.lower}
	if s != nil {
		lowers = []string{s.Frozen, r.lower}
	}
	for _, l := range lowers {
		if _, err := os.Stat(l); err != nil {
			return nil, fmt.Errorf("sandbox %s: lower dir (rollback to the head rebuilds a missing frozen layer): %w", r.dir, err)
		}
	}
	return lowers, nil
}

// StackOptions returns the overlay mount data for lowers (topmost first)
// under upper. Kept pure so option strings are testable without root.
func StackOptions(lowers []string, upper, work string) (string, error) {
	if len(lowers) == 0 || len(lowers) > MaxStackDepth+1 {
		return "", fmt.Errorf("overlay stack of %d lower dirs (at most %d frozen layers on a base): %w", len(lowers), MaxStackDepth, errdefs.ErrInvalid)
	}
	for _, p := range lowers[:len(lowers)-1] {
		if err := checkOptionPath(p); err != nil {
			return "", err
		}
	}
	opts, err := MountOptions(lowers[len(lowers)-1], upper, work)
	if err != nil {
		return "", err
	}
	if len(lowers) == 1 {
		return opts, nil
	}
	// lowerdir=TOP:...:BASE, every path checked free of ':' and ','.
	top := ""
	for _, p := range lowers[:len(lowers)-1] {
		top += p + ":"
	}
	return "lowerdir=" + top + opts[len("lowerdir="):], nil
}

// SetLoader gives the backend's roots the blob reader their stacked
// scans compose with (the engine's content repository, which it may
// replace: hence a function).
func (b *Backend) SetLoader(fn func() delta.BlobLoader) { b.loader = fn }

// CreateStacked lays out a new root in dir (which must not exist) whose
// state is tree, by stacking it on tree's frozen layer over lower dir
// base, and mounts it: no file is copied. stateKey is tree's state key (the
// checkpoint's). It fails with errdefs.ErrNotFound if the layer is gone.
func (b *Backend) CreateStacked(ctx context.Context, dir, base string, tree, stateKey delta.ID) (rootfs.Root, error) {
	if err := checkOptionPath(base); err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("sandbox dir %s: %w", dir, errdefs.ErrExists)
		}
		return nil, fmt.Errorf("sandbox dir: %w", err)
	}
	r := b.root(dir, base)
	fail := func(err error) (rootfs.Root, error) {
		r.Unmount(context.WithoutCancel(ctx))
		os.RemoveAll(dir)
		return nil, err
	}
	if err := os.Mkdir(filepath.Join(dir, "root"), 0o755); err != nil {
		return fail(fmt.Errorf("sandbox dir: %w", err))
	}
	g, err := os.MkdirTemp(dir, "gen-")
	if err != nil {
		return fail(err)
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(g, d), 0o755); err != nil {
			return fail(err)
		}
	}
	// Under the layers' lock: once the stack file exists the layer is in
	// use (FrozenUser), so frozen.Layers.Remove never takes it from under
	// this root.
	layer, ok, release := b.layers.Hold(tree)
	if !ok {
		release()
		return fail(fmt.Errorf("frozen layer of tree %s: %w", tree.Short(), errdefs.ErrNotFound))
	}
	data, _ := json.Marshal(stack{Frozen: layer, Tree: tree, StateKey: stateKey})
	err = os.WriteFile(filepath.Join(g, stackFileName), data, 0o600)
	release()
	if err == nil {
		err = r.switchTo(g)
	}
	if err != nil {
		return fail(err)
	}
	if err := r.Mount(ctx); err != nil {
		return fail(err)
	}
	return r, nil
}

// FrozenUser returns the frozen layer directory a generation of the root
// kept in dir stacks on, or "" for none (a plain root, no root): the live
// generation's, else one a restore or branch in progress (or a crashed one,
// until the next mount clears it) is making.
func FrozenUser(dir string) string {
	gens, _ := filepath.Glob(filepath.Join(dir, "gen-*"))
	if g, err := Open(dir, "").gen(); err == nil {
		gens = append([]string{g}, gens...)
	}
	for _, g := range gens {
		if s, err := readStack(g); err == nil && s != nil {
			return s.Frozen
		}
	}
	return ""
}

// LiveUpper is the writable layer of the root kept in dir: its live
// generation's upper. A freeze reads a checkpoint's files from there, not
// through the mount, so it never keeps the mount busy (an unmount for a
// rollback or a removal must not fail because of it).
func LiveUpper(dir string) (string, error) {
	g, err := Open(dir, "").gen()
	if err != nil {
		return "", err
	}
	return filepath.Join(g, "upper"), nil
}

// Stacked reports whether the root's live generation stacks on a frozen
// layer (its upper is relative to that layer, not to the base).
func (r *Root) Stacked() bool {
	g, err := r.gen()
	if err != nil {
		return false
	}
	s, err := readStack(g)
	return err == nil && s != nil
}

// scanStacked scans a stacked generation: the upper's own scan, whose data
// chunks are saved and whose trees are kept aside, composed onto the
// frozen layer's tree.
func (r *Root) scanStacked(ctx context.Context, g string, s *stack, saver delta.BlobSaver, prev *fstree.ScanCache, reread map[string]bool) (*fstree.ScanResult, error) {
	if r.loader == nil {
		return nil, fmt.Errorf("sandbox %s: a stacked root is scanned through its backend (no tree loader): %w", r.dir, errdefs.ErrPrecondition)
	}
	col := &treeCollector{next: saver, trees: map[delta.ID][]byte{}}
	res, err := r.scanUpper(ctx, filepath.Join(g, "upper"), col, prev, fstree.ScanOptions{Reread: reread})
	if err != nil {
		return nil, err
	}
	if res.Root == r.ids.EmptyTree() {
		res.Root, res.StateKey = s.Tree, s.StateKey // nothing changed above the layer
		return res, nil
	}
	baseFD, err := fsat.OpenDir(r.lower)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: lower dir: %w", r.dir, err)
	}
	defer unix.Close(baseFD)
	c := newComposer(r.ids, r.loader(), col.trees, saver)
	c.shared, c.base = r.keys, r.lower
	if res.Root, err = c.dir(ctx, "", res.Root, s.Tree, baseFD); err != nil {
		return nil, fmt.Errorf("sandbox %s: compose onto frozen layer %s: %w", r.dir, s.Tree.Short(), err)
	}
	if res.StateKey, err = c.key(ctx, "", res.Root, false, baseFD); err != nil {
		return nil, fmt.Errorf("sandbox %s: state key: %w", r.dir, err)
	}
	return res, nil
}

// treeCollector passes data blobs on (if there is a saver) and keeps trees:
// the upper's trees are not the root's state, only input to compose.
type treeCollector struct {
	next  delta.BlobSaver
	trees map[delta.ID][]byte
}

func (c *treeCollector) SaveBlob(ctx context.Context, t delta.BlobType, id delta.ID, data []byte) (bool, error) {
	if t == delta.BlobTree {
		c.trees[id] = bytes.Clone(data)
		return true, nil
	}
	if c.next == nil {
		return true, nil
	}
	return c.next.SaveBlob(ctx, t, id, data)
}
