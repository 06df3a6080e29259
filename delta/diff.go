package delta

import (
	"context"
	"errors"
	"path"
	"slices"
)

// Layers names a filesystem state as a stack of trees, bottom first: a base
// tree and the writable layers above it, combined with overlayfs semantics
// (a whiteout hides the lower name, an opaque directory hides the lower
// directory's entries, other directories merge).
type Layers []ID

// ChangeKind is the kind of a Change: 'A'dded, 'M'odified or 'D'eleted.
type ChangeKind byte

const (
	Added    ChangeKind = 'A'
	Modified ChangeKind = 'M'
	Deleted  ChangeKind = 'D'
)

func (k ChangeKind) String() string {
	switch k {
	case Added:
		return "added"
	case Modified:
		return "modified"
	case Deleted:
		return "deleted"
	}
	return "?"
}

// Change is one path that differs between two states.
type Change struct {
	Kind ChangeKind
	Path string // root-relative
	Type Type   // the entry's type in the newer state (the older one for deletions)
	// Old and New are the entry in each state (zero Name where it is
	// absent: New of a deletion, Old of an addition), so a caller can say
	// what changed (mode, owner, mtime, xattrs, target, content). A
	// hardlink's entry is the link; Lookup finds its primary.
	Old, New Entry
}

// merged is one name of a merged directory: its topmost entry and, for a
// directory, the stack of subtrees that make up its contents.
type merged struct {
	e   Entry
	sub Layers
}

// listMerged returns the merged entries of the directory whose layers are l.
func listMerged(ctx context.Context, loader BlobLoader, l Layers) (map[string]merged, error) {
	out := map[string]merged{}
	for _, id := range l {
		if id.IsZero() {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		t, err := LoadTree(ctx, loader, id)
		if err != nil {
			return nil, err
		}
		for _, e := range t.Entries {
			below, ok := out[e.Name]
			switch {
			case e.Type == TypeWhiteout:
				delete(out, e.Name)
			case e.Type == TypeDir && ok && below.e.Type == TypeDir && !e.Opaque:
				out[e.Name] = merged{e: e, sub: append(slices.Clone(below.sub), e.Subtree)}
			case e.Type == TypeDir:
				out[e.Name] = merged{e: e, sub: Layers{e.Subtree}}
			default:
				out[e.Name] = merged{e: e}
			}
		}
	}
	return out, nil
}

// Diff lists the paths that differ between the states from and to, sorted by
// path. Subtrees whose layer stacks are identical are not opened, so the cost
// follows the size of the change. Directory mtimes alone do not make a
// directory modified (they move whenever a child is added or removed, which
// is reported on its own).
func Diff(ctx context.Context, loader BlobLoader, from, to Layers) ([]Change, error) {
	var out []Change
	err := diffDir(ctx, loader, "", from, to, func(c Change) error {
		out = append(out, c)
		return nil
	})
	return out, err
}

// Changed reports whether Diff would list anything, stopping at the first
// difference. It is how a turn is classified on the merged state, so that
// a turn is class fs exactly when its diff is not empty.
func Changed(ctx context.Context, loader BlobLoader, from, to Layers) (bool, error) {
	err := diffDir(ctx, loader, "", from, to, func(Change) error { return errStopDiff })
	if errors.Is(err, errStopDiff) {
		return true, nil
	}
	return false, err
}

var errStopDiff = errors.New("stop diff")

func diffDir(ctx context.Context, loader BlobLoader, rel string, from, to Layers, out func(Change) error) error {
	if slices.Equal(from, to) {
		return nil
	}
	a, err := listMerged(ctx, loader, from)
	if err != nil {
		return err
	}
	b, err := listMerged(ctx, loader, to)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(a)+len(b))
	for n := range a {
		names = append(names, n)
	}
	for n := range b {
		if _, ok := a[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		p := path.Join(rel, n)
		x, inA := a[n]
		y, inB := b[n]
		switch {
		case !inB:
			if err := walkAll(ctx, loader, p, x, Deleted, out); err != nil {
				return err
			}
		case !inA:
			if err := walkAll(ctx, loader, p, y, Added, out); err != nil {
				return err
			}
		case x.e.Type == TypeDir && y.e.Type == TypeDir:
			if !sameMeta(&x.e, &y.e, false) {
				if err := out(Change{Kind: Modified, Path: p, Type: TypeDir, Old: x.e, New: y.e}); err != nil {
					return err
				}
			}
			if err := diffDir(ctx, loader, p, x.sub, y.sub, out); err != nil {
				return err
			}
		case x.e.Type == TypeDir || y.e.Type == TypeDir:
			// A directory replaced by a non-directory or the reverse: the
			// whole old subtree is gone and the new one is new.
			if err := walkAll(ctx, loader, p, x, Deleted, out); err != nil {
				return err
			}
			if err := walkAll(ctx, loader, p, y, Added, out); err != nil {
				return err
			}
		case !sameMeta(&x.e, &y.e, true):
			if err := out(Change{Kind: Modified, Path: p, Type: y.e.Type, Old: x.e, New: y.e}); err != nil {
				return err
			}
		}
	}
	return nil
}

// walkAll reports m and, for a directory, everything below it as kind.
func walkAll(ctx context.Context, loader BlobLoader, p string, m merged, kind ChangeKind, out func(Change) error) error {
	c := Change{Kind: kind, Path: p, Type: m.e.Type}
	if kind == Deleted {
		c.Old = m.e
	} else {
		c.New = m.e
	}
	if err := out(c); err != nil {
		return err
	}
	if m.e.Type != TypeDir {
		return nil
	}
	entries, err := listMerged(ctx, loader, m.sub)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := walkAll(ctx, loader, path.Join(p, n), entries[n], kind, out); err != nil {
			return err
		}
	}
	return nil
}

// sameMeta compares two entries of one name, ignoring the subtree (compared
// by recursion) and, unless withMtime, the mtime.
func sameMeta(x, y *Entry, withMtime bool) bool {
	if x.Type != y.Type || x.Mode != y.Mode || x.UID != y.UID || x.GID != y.GID ||
		x.Size != y.Size || x.Target != y.Target || x.Rdev != y.Rdev ||
		(withMtime && x.MtimeNs != y.MtimeNs) || !SameChunks(x, y) || !slices.Equal(x.Holes, y.Holes) {
		return false
	}
	return slices.EqualFunc(x.Xattrs, y.Xattrs, func(a, b Xattr) bool {
		return a.Name == b.Name && string(a.Value) == string(b.Value)
	})
}
