package frozen

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// Frozen layers (docs/STORAGE.md, "Frozen layers"): a checkpoint's
// writable layer kept read-only on this host, so that a branch of it mounts
// the layer as a lower (lowerdir=FROZEN:BASE) over an empty upper instead of
// copying it. One lives at BASES/.frozen/<tree id>: the tree in overlay
// upper form (whiteouts as 0:0 devices, opaque directories marked), exactly
// what a materialised upper of that tree holds. Keyed by tree, not by
// checkpoint, so a process-only checkpoint shares its parent's layer.
//
// A layer is built in BASES/.frozen/.tmp-* and published with one rename,
// so a layer that exists is complete; a crash leaves a .tmp-* that the next
// freeze removes. It is removed by renaming it to .rm-* first, under the
// backend's lock, after checking again that no root's live generation
// stacks on it.

const frozenDirName = ".frozen"

// NewLayers returns the frozen layers kept under basesDir (in its .frozen
// directory). translate maps a layer's entries (in overlay upper form) to
// the tree format, as a scan of an overlay upper does (overlay.Translate).
func NewLayers(basesDir string, translate func(rel string, st *unix.Stat_t, e *delta.Entry) (bool, error)) *Layers {
	return &Layers{top: filepath.Join(basesDir, frozenDirName), translate: translate}
}

// SetIDs sets the content ID scheme freezes and verifies use (default:
// plain BLAKE3). Call it before the layers are used.
func (b *Layers) SetIDs(ids delta.IDs) { b.ids = ids }

// ErrNotFreezable marks a tree this host does not keep frozen: a device
// node in a lower layer shared by many sandboxes would reach past each
// one's device rules (such checkpoints are branched by materialising).
var ErrNotFreezable = errors.New("tree cannot be kept as a frozen layer")

// Source is a frozen layer a new one may share files with (Tree,
// zero for none), and the layers it may be made from (Reuse).
type Source struct {
	Tree delta.ID
	// Reuse lists layers the caller would remove now (no retention rule
	// keeps them), best first. Freeze takes the first that no root stacks
	// on (InUse, asked under the backend's lock) and no other freeze reads
	// out of the namespace and changes it into the new layer name by name
	// (patch.go): the cost of the change, not of the layer.
	Reuse []delta.ID
	InUse func(dir string) bool
	// Yield, if set, is called before each entry is made: background work
	// waits there while the engine has turns in flight.
	Yield func()
}

// Stats counts how a frozen layer was made.
type Stats struct {
	Entries   int64
	Linked    int64 // files cloned from the source layer (reflink, else in-kernel copy; never a hardlink)
	Copied    int64 // files copied from the live root, verified chunk by chunk
	FromStore int64 // files whose live copy no longer matched: read from the store
	Bytes     int64 // bytes written
	// Reused is the layer an incremental freeze was made from (zero: built
	// in full); Patched and Removed count the names it changed.
	Reused           delta.ID
	Patched, Removed int64
}

// Layers is one host's frozen layers, in one directory (BASES/.frozen).
// Its lock serialises publishing, removing and stacking a root on a layer.
type Layers struct {
	top       string    // the directory
	ids       delta.IDs // the home's content ID scheme (SetIDs)
	translate func(rel string, st *unix.Stat_t, e *delta.Entry) (bool, error)
	mu        sync.Mutex
	swept     bool             // leftovers of earlier processes cleared
	removing  sync.WaitGroup   // deletions of removed layers in progress
	reading   map[delta.ID]int // layers a freeze links files from: never reused
	// links memoises hasLinks by tree (patch.go).
	memoMu sync.Mutex
	links  map[delta.ID]bool
}

// Dir is where the frozen layer of tree lives (whether or not it
// exists).
func (b *Layers) Dir(tree delta.ID) string {
	return filepath.Join(b.top, tree.String())
}

// Has reports whether this host keeps tree as a frozen layer.
func (b *Layers) Has(tree delta.ID) bool {
	st, err := os.Stat(b.Dir(tree))
	return err == nil && st.IsDir()
}

// Trees lists the trees this host keeps frozen.
func (b *Layers) Trees() ([]delta.ID, error) {
	ents, err := os.ReadDir(b.top)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []delta.ID
	for _, e := range ents {
		if id, err := delta.ParseID(e.Name()); err == nil && e.IsDir() {
			out = append(out, id)
		}
	}
	return out, nil
}

// Freeze keeps tree as a frozen layer unless it exists already. Files equal
// (content and metadata) to those of src's layer are hardlinked from it;
// the others are copied from live, the mounted root whose state tree is
// (an open sandbox that may have changed since: every chunk is hashed and
// compared with the tree's), and read from loader (verified) where the
// copy does not match. live may be "" (everything from src or the store).
// With src.Reuse it may instead change an unkept layer into this one
// (Source.Reuse, patch.go).
// built, if set, runs once the layer is built and synced, just before it is
// published (a test's point to kill the process).
func (b *Layers) Freeze(ctx context.Context, tree delta.ID, live string, src *Source, loader delta.BlobLoader, built func()) (Stats, error) {
	var stats Stats
	if b.Has(tree) {
		return stats, nil
	}
	top := b.top
	if err := os.MkdirAll(top, 0o700); err != nil {
		return stats, err
	}
	b.Sweep()
	f := &freezer{ids: b.ids, loader: loader, stats: &stats, xbuf: make([]byte, fsat.XattrBufSize), liveFD: -1, srcFD: -1}
	if live != "" {
		fd, err := fsat.OpenDir(live)
		if err != nil {
			return stats, err
		}
		defer unix.Close(fd)
		f.liveFD = fd
	}
	var srcTree delta.ID
	if src != nil && !src.Tree.IsZero() {
		if fd, done, err := b.readLayer(src.Tree); err == nil && done != nil {
			f.srcFD, srcTree = fd, src.Tree
			defer func() {
				unix.Close(f.srcFD)
				done()
			}()
		}
	}
	if src != nil {
		f.yield = src.Yield
	}
	tmp, old, err := b.takeLayer(ctx, top, tree, src, loader)
	if err != nil {
		return stats, err
	}
	defer func() { os.RemoveAll(tmp) }() // a no-op once renamed
	if !old.IsZero() {
		stats.Reused = old
		err = f.build(ctx, tmp, tree, old, srcTree)
		if err != nil && ctx.Err() == nil && !errors.Is(err, ErrNotFreezable) {
			// The old layer cannot be changed into this one (its tree
			// unreadable, say): it is lost, so build the new one in full.
			os.RemoveAll(tmp)
			if tmp, err = os.MkdirTemp(top, ".tmp-"); err != nil {
				return stats, err
			}
			stats = Stats{}
			old = delta.ID{}
		}
	}
	if old.IsZero() {
		err = f.build(ctx, tmp, tree, delta.ID{}, srcTree)
	}
	if err != nil {
		return stats, fmt.Errorf("freeze tree %s: %w", tree.Short(), err)
	}
	if err := syncFS(tmp); err != nil {
		return stats, err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return stats, err
	}
	// The top's mtime says when the layer was published (a reused one's
	// may be old): retention leaves layers newer than its pass alone.
	if now := time.Now(); os.Chtimes(tmp, now, now) != nil {
		return stats, fmt.Errorf("freeze tree %s: set the layer's time", tree.Short())
	}
	if built != nil {
		built()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := os.Rename(tmp, b.Dir(tree)); err != nil {
		if b.Has(tree) {
			return stats, nil // another operation froze the same tree
		}
		return stats, fmt.Errorf("freeze tree %s: %w", tree.Short(), err)
	}
	return stats, fsat.SyncDir(top)
}

// build fills the directory tmp with tree: changed from tree old (a reused
// layer's) or, with old zero, made from nothing.
func (f *freezer) build(ctx context.Context, tmp string, tree, old, srcTree delta.ID) error {
	dst, err := fsat.OpenDir(tmp)
	if err != nil {
		return err
	}
	defer unix.Close(dst)
	f.rootFD = dst
	if !old.IsZero() {
		return f.patch(ctx, dst, "", tree, old, srcTree)
	}
	return f.dir(ctx, dst, "", tree, srcTree)
}

// takeLayer makes the directory a new layer of tree is built in: one of
// src.Reuse taken out of the namespace (old names its tree), or else a new
// empty one (old is zero). Either is a .tmp-* the sweep clears after a crash.
func (b *Layers) takeLayer(ctx context.Context, top string, tree delta.ID, src *Source, loader delta.BlobLoader) (tmp string, old delta.ID, err error) {
	if cands := b.reusable(ctx, tree, src, loader); len(cands) > 0 {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, cand := range cands {
			if b.reading[cand] > 0 || !b.Has(cand) || src.InUse(b.Dir(cand)) {
				continue
			}
			if tmp, err = os.MkdirTemp(top, ".tmp-"); err != nil {
				return "", old, err
			}
			// rename(2) replaces the empty directory (os.Rename refuses to).
			if err := unix.Rename(b.Dir(cand), tmp); err != nil {
				os.Remove(tmp)
				continue
			}
			return tmp, cand, nil
		}
	}
	tmp, err = os.MkdirTemp(top, ".tmp-")
	return tmp, delta.ID{}, err
}

// reusable filters src.Reuse to the layers an incremental freeze of tree
// may start from: a hardlink group may span unchanged subtrees, so trees
// holding one (either side) are built in full (patch.go).
func (b *Layers) reusable(ctx context.Context, tree delta.ID, src *Source, loader delta.BlobLoader) []delta.ID {
	if src == nil || src.InUse == nil || len(src.Reuse) == 0 {
		return nil
	}
	if links, err := b.hasLinks(ctx, loader, tree); err != nil || links {
		return nil
	}
	var out []delta.ID
	for _, cand := range src.Reuse {
		if cand == tree || cand == src.Tree {
			continue
		}
		if links, err := b.hasLinks(ctx, loader, cand); err == nil && !links {
			out = append(out, cand)
		}
	}
	return out
}

// Sweep removes, once per process, what a killed freeze or removal
// left (the home's lock keeps out any other process; this one's own
// builds start after it).
func (b *Layers) Sweep() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.swept {
		b.swept = true
		clearFrozenLeftovers(b.top)
	}
}

// clearFrozenLeftovers removes what a killed freeze or removal left.
func clearFrozenLeftovers(top string) {
	for _, pat := range []string{".tmp-*", ".rm-*"} {
		m, _ := filepath.Glob(filepath.Join(top, pat))
		for _, p := range m {
			os.RemoveAll(p)
		}
	}
}

// Remove deletes the frozen layer of tree unless inUse (asked again
// under the backend's lock, so a root stacked meanwhile keeps its layer)
// says a root stacks on it. It reports whether the layer was removed.
func (b *Layers) Remove(tree delta.ID, inUse func(dir string) bool) (bool, error) {
	b.mu.Lock()
	dir := b.Dir(tree)
	// A layer being read (a freeze's source, a verify) stays until the
	// next retention pass: a removal under the reader would fail it.
	if !b.Has(tree) || inUse(dir) || b.reading[tree] > 0 {
		b.mu.Unlock()
		return false, nil
	}
	gone, err := os.MkdirTemp(filepath.Dir(dir), ".rm-")
	if err == nil {
		err = os.Rename(dir, filepath.Join(gone, "layer"))
	}
	b.mu.Unlock()
	if err != nil {
		if gone != "" {
			os.Remove(gone)
		}
		return false, fmt.Errorf("frozen layer %s: %w", tree.Short(), err)
	}
	// Out of the namespace now: the unlinks (one per file of the layer)
	// need not hold up the caller. A process that exits first leaves the
	// .rm- dir to the next one's sweep; WaitRemovals waits for them.
	b.removing.Add(1)
	go func() {
		defer b.removing.Done()
		os.RemoveAll(gone)
	}()
	return true, nil
}

// WaitRemovals waits until the layers Remove removed are deleted.
func (b *Layers) WaitRemovals() { b.removing.Wait() }

// Verify re-hashes this host's frozen layer of tree, if it keeps one,
// and reports whether it did. A branch stacks on the layer and reads its
// files as they are on disk, so damage there would reach every branch of
// the checkpoint; a layer that no longer scans to its tree (upper form,
// the home's ID scheme) is ErrCorrupt. Removing it is safe: a branch then
// materialises from the store, and the next freeze builds it again.
func (b *Layers) Verify(ctx context.Context, tree delta.ID) (bool, error) {
	// Registered as a reader, so no freeze takes the layer to patch and no
	// retention pass removes it under the scan (a verify of a layer that
	// retention retired meanwhile read a half-patched tree).
	fd, done, err := b.readLayer(tree)
	if err != nil {
		return true, fmt.Errorf("frozen layer %s: %w", b.Dir(tree), err)
	}
	if done == nil {
		return false, nil
	}
	unix.Close(fd)
	defer done()
	dir := b.Dir(tree)
	res, err := fstree.Scan(ctx, dir, fstree.ScanOptions{IDs: b.ids, Translate: b.translate, Quiescent: true})
	if err != nil {
		return true, fmt.Errorf("frozen layer %s: %w", dir, err)
	}
	if res.Root != tree {
		return true, fmt.Errorf("frozen layer %s hashes to %s, not its tree (remove it and branches materialise from the store): %w",
			dir, res.Root.Short(), errdefs.ErrCorrupt)
	}
	return true, nil
}

// readLayer opens tree's layer and counts a reader of it until done: a
// freeze takes no layer that is being read (takeLayer). done is nil when
// this host has no such layer.
func (b *Layers) readLayer(tree delta.ID) (fd int, done func(), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.Has(tree) {
		return -1, nil, nil
	}
	if fd, err = fsat.OpenDir(b.Dir(tree)); err != nil {
		return -1, nil, err
	}
	if b.reading == nil {
		b.reading = map[delta.ID]int{}
	}
	b.reading[tree]++
	return fd, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.reading[tree]--; b.reading[tree] <= 0 {
			delete(b.reading, tree)
		}
	}, nil
}

// Hold takes the layers' lock for a root about to stack on tree's layer:
// while it is held no layer is published, removed or taken for a patch,
// and once the root's stack file exists the layer is in use (InUse). ok
// says the layer exists; release must be called either way.
func (b *Layers) Hold(tree delta.ID) (dir string, ok bool, release func()) {
	b.mu.Lock()
	return b.Dir(tree), b.Has(tree), b.mu.Unlock
}

// syncFS flushes the filesystem holding dir: one syncfs for a whole
// layer's files instead of an fsync each.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
