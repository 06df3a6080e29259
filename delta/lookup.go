package delta

import (
	"context"
	"fmt"
	"strings"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Lookup finds the entry a root-relative path names in the state l (with
// the overlay semantics of Layers), loading only the directories on the
// way. A hardlink is followed to its primary. ok is false when nothing by
// that name exists.
func Lookup(ctx context.Context, loader BlobLoader, l Layers, p string) (e Entry, ok bool, err error) {
	for range 2 { // the name, then a hardlink's primary
		e, ok, err = lookup(ctx, loader, l, p)
		if err != nil || !ok || e.Type != TypeHardlink {
			return e, ok, err
		}
		p = e.Target
	}
	return e, false, fmt.Errorf("lookup %s: hardlink to a hardlink: %w", p, errdefs.ErrCorrupt)
}

func lookup(ctx context.Context, loader BlobLoader, l Layers, p string) (Entry, bool, error) {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	dir := l
	for i, name := range parts {
		m, err := listMerged(ctx, loader, dir)
		if err != nil {
			return Entry{}, false, err
		}
		got, ok := m[name]
		if !ok {
			return Entry{}, false, nil
		}
		if i == len(parts)-1 {
			return got.e, true, nil
		}
		if got.e.Type != TypeDir {
			return Entry{}, false, nil
		}
		dir = got.sub
	}
	return Entry{}, false, nil
}
