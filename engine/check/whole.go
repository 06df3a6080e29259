package check

import (
	"context"
	"errors"
	"fmt"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Whole decides which checkpoints a store can restore, without restoring
// them: every tree a checkpoint's roots reach is located, loads, hashes to
// its ID and decodes, and every chunk those trees name is located in some
// pack. A catalog rebuild indexes only whole checkpoints, so one damaged or
// hostile object costs the checkpoints that need it and no others.
//
// It reads each distinct tree once, however many checkpoints share it, and
// counts references as CountRefs does over the trees it found whole.
// Chunks are not read: a chunk whose content lies (a zstd bomb, a size the
// tree contradicts) is found by verify and refused by every restore.
type Whole struct {
	// Loader reads trees; Has says whether the blob index locates a blob.
	// Has is asked first, so that a blob in no pack is reported as missing
	// whatever fallback the loader has.
	Loader delta.BlobLoader
	Has    func(delta.ID) bool

	trees  map[delta.ID]error // nil: the tree and everything under it is whole
	counts map[delta.ID]int64
	failed bool
}

// errInWalk marks a tree whose walk is under way: a tree reached again
// below itself cannot hash to its own ID, but a loader that does not check
// hashes must not make the walk loop.
var errInWalk = fmt.Errorf("tree refers to itself: %w", errdefs.ErrCorrupt)

// Checkpoint checks one checkpoint. It returns nil when cp is whole, an
// error wrapping ErrNotFound when an object it needs is in no pack, one
// wrapping ErrCorrupt when one is damaged, and any other error (the store
// did not answer, ctx ended) as it came: that is not the checkpoint's fault.
func (w *Whole) Checkpoint(ctx context.Context, cp *delta.Checkpoint) error {
	if w.trees == nil {
		w.trees, w.counts = map[delta.ID]error{}, map[delta.ID]int64{}
	}
	for _, root := range cp.Roots() {
		if err := w.tree(ctx, root, 0); err != nil {
			if Skippable(err) {
				w.failed = true
			}
			return fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
		}
	}
	for _, root := range cp.Roots() {
		w.counts[root]++
	}
	return nil
}

// Counts returns the reference counts of the whole checkpoints checked so
// far. Exact says whether they are final: a tree found whole is counted
// when found, so when some checkpoint was not whole, trees only it reached
// are counted too, and the caller must recount over the whole ones
// (CountRefs).
func (w *Whole) Counts() (counts map[delta.ID]int64, exact bool) {
	if w.counts == nil {
		return map[delta.ID]int64{}, true
	}
	return w.counts, !w.failed
}

// Skippable says whether err is about the store's objects (missing or
// damaged), so the checkpoint, not the whole operation, fails. A sealed
// object that does not open is a key problem, never skippable: with the
// wrong key every object would be skipped.
func Skippable(err error) bool {
	if errors.Is(err, errdefs.ErrKey) {
		return false
	}
	return errors.Is(err, errdefs.ErrCorrupt) || errors.Is(err, errdefs.ErrNotFound)
}

func (w *Whole) tree(ctx context.Context, id delta.ID, depth int) error {
	if err, ok := w.trees[id]; ok {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	w.trees[id] = errInWalk
	err := w.walk(ctx, id, depth)
	if err != nil && !Skippable(err) {
		delete(w.trees, id) // not the tree's fault: never remembered
		return err
	}
	w.trees[id] = err
	return err
}

func (w *Whole) walk(ctx context.Context, id delta.ID, depth int) error {
	if depth > delta.MaxDepth {
		return fmt.Errorf("tree %s: directories nested more than %d deep: %w", id.Short(), delta.MaxDepth, errdefs.ErrCorrupt)
	}
	if !w.Has(id) {
		return fmt.Errorf("tree %s is in no pack: %w", id.Short(), errdefs.ErrNotFound)
	}
	t, err := delta.LoadTreeShallow(ctx, w.Loader, id)
	if err != nil {
		return err
	}
	for _, en := range t.Entries {
		switch en.Type {
		case delta.TypeDir:
			if err := w.tree(ctx, en.Subtree, depth+1); err != nil {
				return err
			}
		case delta.TypeFile:
			if en.Indirect() {
				if err := w.list(ctx, id, &en); err != nil {
					return err
				}
				continue
			}
			for _, c := range en.Chunks {
				if !w.Has(c) {
					return fmt.Errorf("tree %s: chunk %s of %q is in no pack: %w", id.Short(), c.Short(), en.Name, errdefs.ErrNotFound)
				}
			}
		}
	}
	for _, r := range t.Refs() {
		w.counts[r]++
	}
	return nil
}

// list checks an indirect file's chunk list as tree checks a tree: located,
// loaded, decoded, every chunk it names located; remembered by ID and its
// chunks counted once however many trees name it.
func (w *Whole) list(ctx context.Context, in delta.ID, en *delta.Entry) error {
	id := en.ChunkList
	if err, ok := w.trees[id]; ok {
		return err
	}
	err := func() error {
		if !w.Has(id) {
			return fmt.Errorf("tree %s: chunk list %s of %q is in no pack: %w", in.Short(), id.Short(), en.Name, errdefs.ErrNotFound)
		}
		chunks, err := delta.LoadChunkList(ctx, w.Loader, id, en.NChunks)
		if err != nil {
			return fmt.Errorf("tree %s: file %q: %w", in.Short(), en.Name, err)
		}
		for _, c := range chunks {
			if !w.Has(c) {
				return fmt.Errorf("tree %s: chunk %s of %q is in no pack: %w", in.Short(), c.Short(), en.Name, errdefs.ErrNotFound)
			}
		}
		for _, c := range chunks {
			w.counts[c]++
		}
		return nil
	}()
	if err != nil && !Skippable(err) {
		return err // not the list's fault: never remembered
	}
	w.trees[id] = err
	return err
}
