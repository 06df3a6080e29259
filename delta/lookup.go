package delta

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Lookup finds the entry a root-relative path names in the state l (with
// the overlay semantics of Layers), loading only the directories on the
// way. A hardlink is followed to its primary. ok is false when nothing by
// that name exists.
func Lookup(ctx context.Context, loader BlobLoader, l Layers, p string) (e Entry, ok bool, err error) {
	for range 2 { // the name, then a hardlink's primary
		var m merged
		m, ok, err = lookup(ctx, loader, l, p)
		if err != nil || !ok || m.e.Type != TypeHardlink {
			return m.e, ok, err
		}
		p = m.e.Target
	}
	return e, false, fmt.Errorf("lookup %s: hardlink to a hardlink: %w", p, errdefs.ErrCorrupt)
}

// LookupDir is Lookup for a name the caller wants to descend into: for a
// directory it also returns the stack of subtrees that make up its merged
// contents. "" is the root (Entry zero, Type TypeDir). Hardlinks are not
// followed.
func LookupDir(ctx context.Context, loader BlobLoader, l Layers, p string) (Entry, Layers, bool, error) {
	if strings.Trim(p, "/") == "" {
		return Entry{Type: TypeDir}, l, true, nil
	}
	m, ok, err := lookup(ctx, loader, l, p)
	return m.e, m.sub, ok, err
}

// ListDir returns the merged entries of the directory whose layers are l,
// sorted by name (whiteouts resolved, never listed).
func ListDir(ctx context.Context, loader BlobLoader, l Layers) ([]Entry, []Layers, error) {
	m, err := listMerged(ctx, loader, l)
	if err != nil {
		return nil, nil, err
	}
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	entries, subs := make([]Entry, len(names)), make([]Layers, len(names))
	for i, n := range names {
		entries[i], subs[i] = m[n].e, m[n].sub
	}
	return entries, subs, nil
}

func lookup(ctx context.Context, loader BlobLoader, l Layers, p string) (merged, bool, error) {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	dir := l
	for i, name := range parts {
		m, err := listMerged(ctx, loader, dir)
		if err != nil {
			return merged{}, false, err
		}
		got, ok := m[name]
		if !ok {
			return merged{}, false, nil
		}
		if i == len(parts)-1 {
			return got, true, nil
		}
		if got.e.Type != TypeDir {
			return merged{}, false, nil
		}
		dir = got.sub
	}
	return merged{}, false, nil
}
