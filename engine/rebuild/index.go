package rebuild

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/check"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// skipClassOf maps an object fault to its class.
func skipClassOf(err error) SkipClass {
	if errors.Is(err, errdefs.ErrCorrupt) {
		return SkipCorrupt
	}
	return SkipMissingObjects
}

// rebuildBatch bounds the writes of one catalog transaction in a rebuild
// (Badger refuses a transaction past its size limit).
const rebuildBatch = 1000

// packIndex is the blob index a rebuild makes from pack headers. A blob in
// several packs (two hosts stored it, or a hostile pack claims its ID) is
// located in the oldest pack, which held it before any later copy could
// shadow it; a tree whose chosen copy does not verify is read from the
// others (see treeLoader).
type packIndex struct {
	locs  map[delta.ID]catalog.BlobLocation
	mtime map[delta.ID]time.Time // of the pack locs names, for blobs seen twice
	alts  map[delta.ID][]catalog.BlobLocation
}

func (x *packIndex) add(id delta.ID, loc catalog.BlobLocation, mod time.Time) {
	old, dup := x.locs[id]
	if !dup {
		x.locs[id] = loc
		x.mtime[id] = mod
		return
	}
	if mod.Before(x.mtime[id]) {
		x.locs[id], x.mtime[id] = loc, mod
		loc = old
	}
	x.alts[id] = append(x.alts[id], loc)
}

// treeLoader reads blobs at the index's locations only (a blob in no pack
// is not found, whatever an old catalog says), and a tree whose copy does
// not verify from the other copies, keeping the first that does and
// reporting the pack of the bad copy (badCopy).
type treeLoader struct {
	blobs   Locations
	x       *packIndex
	badCopy func(pack string, err error) error
}

func (l treeLoader) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	loc, ok := l.x.locs[id]
	if !ok {
		return nil, fmt.Errorf("blob %s is in no pack: %w", id.Short(), errdefs.ErrNotFound)
	}
	data, err := l.blobs.LoaderFor(map[delta.ID]catalog.BlobLocation{id: loc}).LoadBlob(ctx, t, id)
	if err == nil || !check.Skippable(err) {
		return data, err
	}
	for i, alt := range l.x.alts[id] {
		d, aerr := l.blobs.LoaderFor(map[delta.ID]catalog.BlobLocation{id: alt}).LoadBlob(ctx, t, id)
		if aerr == nil {
			l.x.alts[id][i] = loc
			l.x.locs[id] = alt
			if err := l.badCopy(delta.PackName(loc.Pack), fmt.Errorf("%w; the copy in %s is used", err, delta.PackName(alt.Pack))); err != nil {
				return nil, err
			}
			return d, nil
		}
	}
	return nil, err
}
