package fstree

import (
	"context"
	"fmt"
	"github.com/turnsnap/turnsnap/delta"
)

// TreeMemo is an optional interface of a DiffOptions.Loader: decoded trees
// kept between plans. A rollback loop plans between the same two states
// over and over, and decoding (and re-encoding, to check the canonical
// form) the trees on the diff's paths cost more than the rest of the
// plan. Trees are content-addressed, so a tree under an ID is the same
// whichever loader it came from: the plan looks its live trees up there
// too (a rollback's live state is often a state rolled back to before).
// The trees are shared: nothing may change them (the plan and Apply only
// read entries).
type TreeMemo interface {
	// MemoTree returns tree id if the memo holds it.
	MemoTree(id delta.ID) (*delta.Tree, bool)
	// KeepTree offers the memo tree id, decoded from the size bytes the
	// loader served (and so verified). The memo may drop it.
	KeepTree(id delta.ID, t *delta.Tree, size int)
}

// treeMemoOf finds the TreeMemo of l, looking through CheckedLoaders.
func treeMemoOf(l delta.BlobLoader) TreeMemo {
	for {
		switch v := l.(type) {
		case TreeMemo:
			return v
		case *CheckedLoader:
			l = v.next
		default:
			return nil
		}
	}
}

// tree loads tree id through l (as LoadTree), from the plan's memo when it holds it;
// keep offers the memo what was decoded (for l the target's loader only:
// the live state's trees are the scan's, never verified against a store).
func (p *DiffPlan) tree(ctx context.Context, l delta.BlobLoader, id delta.ID, keep bool) (*delta.Tree, error) {
	if p.trees != nil {
		if t, ok := p.trees.MemoTree(id); ok {
			return t, nil
		}
	}
	data, err := l.LoadBlob(ctx, delta.BlobTree, id)
	if err != nil {
		return nil, fmt.Errorf("load tree %s: %w", id.Short(), err)
	}
	t, err := delta.DecodeTree(data)
	if err != nil {
		return nil, fmt.Errorf("tree %s: %w", id.Short(), err)
	}
	// The plan compares and restores files by their chunks.
	if err := delta.ResolveChunks(ctx, l, t); err != nil {
		return nil, fmt.Errorf("tree %s: %w", id.Short(), err)
	}
	if keep && p.trees != nil {
		p.trees.KeepTree(id, t, len(data))
	}
	return t, nil
}
