// Package check is the checker: it reads what a checkpoint needs from the
// store and checks every hash, and recounts references, against the
// catalog's index. It is the engine's verify command and the final oracle of
// the engine's tests. Blobs are found through a Locator, so a store-only
// mode (locations from pack headers, no catalog) plugs in without touching
// the checks.
package check

import (
	"context"
	"fmt"
	"slices"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// Blobs is what the checker needs of the content repository: reading a
// blob, and verifying a blob's stored bytes read straight from a pack.
type Blobs interface {
	delta.BlobLoader
	Decode(id delta.ID, object string, loc catalog.BlobLocation, stored []byte) ([]byte, error)
}

// Locator finds where a blob is stored; an error wrapping ErrNotFound
// means nowhere.
type Locator interface {
	Locate(ctx context.Context, id delta.ID) (catalog.BlobLocation, error)
}

// Checker checks checkpoints in one store.
type Checker struct {
	Store upload.Store
	Blobs Blobs
	// Locator says where blobs live; CatalogLocator(cat) for the catalog's
	// index.
	Locator Locator
}

// CatalogLocator locates blobs through the catalog's index.
func CatalogLocator(cat *catalog.Catalog) Locator { return catLocator{cat} }

type catLocator struct{ cat *catalog.Catalog }

func (l catLocator) Locate(ctx context.Context, id delta.ID) (catalog.BlobLocation, error) {
	var loc catalog.BlobLocation
	err := l.cat.View(ctx, func(tx *catalog.Tx) error {
		var ok bool
		var err error
		loc, ok, err = tx.Blob(id)
		if err == nil && !ok {
			err = fmt.Errorf("blob %s: in no known pack: %w", id, errdefs.ErrNotFound)
		}
		return err
	})
	return loc, err
}

// Report says what Verify read.
type Report struct {
	Checkpoint delta.ID
	Objects    []string // every store object read, sorted
	Trees      int64
	Chunks     int64
	Bytes      int64 // plaintext bytes checked
}

// Verify reads every object checkpoint cp needs and checks every hash: the
// record against its id, each pack against its name, each pack header
// against the catalog's index, each blob's plaintext against its id, and each
// tree's canonical encoding (so the tree hashes are recomputed bottom up).
// The first problem is returned as an error naming the object.
func (c *Checker) Verify(ctx context.Context, cp *delta.Checkpoint) (*Report, error) {
	rep := &Report{Checkpoint: cp.ID}
	recData, err := upload.ReadAll(ctx, c.Store, delta.RecordName(cp.ID))
	if err != nil {
		return rep, fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
	}
	rep.Objects = append(rep.Objects, delta.RecordName(cp.ID))
	if _, err := delta.DecodeRecord(cp.ID, recData); err != nil {
		return rep, fmt.Errorf("object %s: %w", delta.RecordName(cp.ID), err)
	}
	// Pass 1: walk the trees to learn every blob and where it lives.
	need := map[delta.ID]catalog.BlobLocation{}
	var walk func(id delta.ID) error
	walk = func(id delta.ID) error {
		if _, ok := need[id]; ok {
			return nil
		}
		if err := c.locate(ctx, id, need); err != nil {
			return err
		}
		t, err := delta.LoadTree(ctx, c.Blobs, id)
		if err != nil {
			return fmt.Errorf("%w (in %s)", err, delta.PackName(need[id].Pack))
		}
		rep.Trees++
		for _, en := range t.Entries {
			switch en.Type {
			case delta.TypeDir:
				if err := walk(en.Subtree); err != nil {
					return err
				}
			case delta.TypeFile:
				for _, ch := range en.Chunks {
					if _, ok := need[ch]; !ok {
						if err := c.locate(ctx, ch, need); err != nil {
							return err
						}
						rep.Chunks++
					}
				}
			}
		}
		return nil
	}
	for _, root := range cp.Roots() {
		if err := walk(root); err != nil {
			return rep, fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
		}
	}
	// Pass 2: read each pack whole, once, and check everything in it.
	byPack := map[delta.ID][]delta.ID{}
	for id, loc := range need {
		byPack[loc.Pack] = append(byPack[loc.Pack], id)
	}
	for pack, blobs := range byPack {
		if err := c.verifyPack(ctx, pack, blobs, need, rep); err != nil {
			return rep, fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
		}
	}
	slices.Sort(rep.Objects)
	return rep, nil
}

func (c *Checker) locate(ctx context.Context, id delta.ID, need map[delta.ID]catalog.BlobLocation) error {
	loc, err := c.Locator.Locate(ctx, id)
	if err != nil {
		return err
	}
	need[id] = loc
	return nil
}

func (c *Checker) verifyPack(ctx context.Context, pack delta.ID, blobs []delta.ID, need map[delta.ID]catalog.BlobLocation, rep *Report) error {
	name := delta.PackName(pack)
	rep.Objects = append(rep.Objects, name)
	data, err := upload.ReadAll(ctx, c.Store, name)
	if err != nil {
		return err
	}
	if got := delta.Hash(data); got != pack {
		return fmt.Errorf("object %s: content hashes to %s: %w", name, got.Short(), errdefs.ErrCorrupt)
	}
	entries, err := delta.ParsePackHeader(data)
	if err != nil {
		return fmt.Errorf("object %s: %w", name, err)
	}
	inHeader := make(map[delta.ID]delta.PackEntry, len(entries))
	for _, en := range entries {
		inHeader[en.ID] = en
	}
	for _, id := range blobs {
		loc := need[id]
		en, ok := inHeader[id]
		if !ok || locationOf(pack, en) != loc {
			return fmt.Errorf("object %s: header does not list blob %s where the catalog says: %w", name, id.Short(), errdefs.ErrCorrupt)
		}
		plain, err := c.Blobs.Decode(id, name, loc, data[loc.Offset:loc.Offset+loc.Length])
		if err != nil {
			return err
		}
		rep.Bytes += int64(len(plain))
	}
	return nil
}

// locationOf is where entry e of pack lives, in the catalog's terms.
func locationOf(pack delta.ID, e delta.PackEntry) catalog.BlobLocation {
	return catalog.BlobLocation{
		Pack: pack, Type: e.Type, Offset: e.Offset, Length: e.Length,
		RawLength: e.RawLength, Compression: uint8(e.Compression),
	}
}
