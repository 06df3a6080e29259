package overlay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/turnsnap/turnsnap/delta"
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

// ErrNotFreezable marks a tree this host does not keep frozen: a device
// node in a lower layer shared by many sandboxes would reach past each
// one's device rules (such checkpoints are branched by materialising).
var ErrNotFreezable = errors.New("tree cannot be kept as a frozen layer")

// FreezeSource is a frozen layer a new one may share files with.
type FreezeSource struct {
	Tree delta.ID
}

// FreezeStats counts how a frozen layer was made.
type FreezeStats struct {
	Entries   int64
	Linked    int64 // files hardlinked from the source layer
	Copied    int64 // files copied from the live root, verified chunk by chunk
	FromStore int64 // files whose live copy no longer matched: read from the store
	Bytes     int64 // bytes written
}

// frozenState is the backend's lock over its frozen layers: publishing,
// removing and stacking a root on one are serialised by it.
type frozenState struct {
	mu       sync.Mutex
	swept    bool           // leftovers of earlier processes cleared
	removing sync.WaitGroup // deletions of removed layers in progress
}

// FrozenDir is where the frozen layer of tree lives (whether or not it
// exists).
func (b *Backend) FrozenDir(tree delta.ID) string {
	return filepath.Join(b.bases, frozenDirName, tree.String())
}

// HasFrozen reports whether this host keeps tree as a frozen layer.
func (b *Backend) HasFrozen(tree delta.ID) bool {
	st, err := os.Stat(b.FrozenDir(tree))
	return err == nil && st.IsDir()
}

// FrozenTrees lists the trees this host keeps frozen.
func (b *Backend) FrozenTrees() ([]delta.ID, error) {
	ents, err := os.ReadDir(filepath.Join(b.bases, frozenDirName))
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
// built, if set, runs once the layer is built and synced, just before it is
// published (a test's point to kill the process).
func (b *Backend) Freeze(ctx context.Context, tree delta.ID, live string, src *FreezeSource, loader delta.BlobLoader, built func()) (FreezeStats, error) {
	var stats FreezeStats
	if b.HasFrozen(tree) {
		return stats, nil
	}
	top := filepath.Join(b.bases, frozenDirName)
	if err := os.MkdirAll(top, 0o700); err != nil {
		return stats, err
	}
	b.frozen.mu.Lock()
	if !b.frozen.swept {
		// Once per process (the home's lock keeps out any other): what a
		// killed freeze or removal left. Later ones may be in progress.
		b.frozen.swept = true
		clearFrozenLeftovers(top)
	}
	b.frozen.mu.Unlock()
	tmp, err := os.MkdirTemp(top, ".tmp-")
	if err != nil {
		return stats, err
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	f := &freezer{loader: loader, stats: &stats, xbuf: make([]byte, fsat.XattrBufSize)}
	dst, err := fsat.OpenDir(tmp)
	if err != nil {
		return stats, err
	}
	defer unix.Close(dst)
	f.rootFD, f.liveFD, f.srcFD = dst, -1, -1
	if live != "" {
		if f.liveFD, err = fsat.OpenDir(live); err != nil {
			return stats, err
		}
		defer unix.Close(f.liveFD)
	}
	var srcTree delta.ID
	if src != nil && b.HasFrozen(src.Tree) {
		if f.srcFD, err = fsat.OpenDir(b.FrozenDir(src.Tree)); err != nil {
			return stats, err
		}
		defer unix.Close(f.srcFD)
		srcTree = src.Tree
	}
	if err := f.dir(ctx, dst, "", tree, srcTree); err != nil {
		return stats, fmt.Errorf("freeze tree %s: %w", tree.Short(), err)
	}
	if err := syncFS(tmp); err != nil {
		return stats, err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return stats, err
	}
	if built != nil {
		built()
	}
	b.frozen.mu.Lock()
	defer b.frozen.mu.Unlock()
	if err := os.Rename(tmp, b.FrozenDir(tree)); err != nil {
		if b.HasFrozen(tree) {
			return stats, nil // another operation froze the same tree
		}
		return stats, fmt.Errorf("freeze tree %s: %w", tree.Short(), err)
	}
	return stats, fsat.SyncDir(top)
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

// RemoveFrozen deletes the frozen layer of tree unless inUse (asked again
// under the backend's lock, so a root stacked meanwhile keeps its layer)
// says a root stacks on it. It reports whether the layer was removed.
func (b *Backend) RemoveFrozen(tree delta.ID, inUse func(dir string) bool) (bool, error) {
	b.frozen.mu.Lock()
	dir := b.FrozenDir(tree)
	if !b.HasFrozen(tree) || inUse(dir) {
		b.frozen.mu.Unlock()
		return false, nil
	}
	gone, err := os.MkdirTemp(filepath.Dir(dir), ".rm-")
	if err == nil {
		err = os.Rename(dir, filepath.Join(gone, "layer"))
	}
	b.frozen.mu.Unlock()
	if err != nil {
		if gone != "" {
			os.Remove(gone)
		}
		return false, fmt.Errorf("frozen layer %s: %w", tree.Short(), err)
	}
	// Out of the namespace now: the unlinks (one per file of the layer)
	// need not hold up the caller. A process that exits first leaves the
	// .rm- dir to the next one's sweep; WaitRemovals waits for them.
	b.frozen.removing.Add(1)
	go func() {
		defer b.frozen.removing.Done()
		os.RemoveAll(gone)
	}()
	return true, nil
}

// WaitRemovals waits until the layers RemoveFrozen removed are deleted.
func (b *Backend) WaitRemovals() { b.frozen.removing.Wait() }
