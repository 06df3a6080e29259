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
	// Keys open the packs of an encrypted store; nil for a plaintext one.
	Keys *delta.Keys
	// IDs is the store's content ID scheme, under which pack names are
	// checked (Blobs checks blobs under it too).
	IDs delta.IDs
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

// MapLocator locates blobs through an index read from pack headers: the
// store-only mode, which needs no catalog.
func MapLocator(index map[delta.ID]catalog.BlobLocation) Locator { return mapLocator(index) }

type mapLocator map[delta.ID]catalog.BlobLocation

func (m mapLocator) Locate(_ context.Context, id delta.ID) (catalog.BlobLocation, error) {
	loc, ok := m[id]
	if !ok {
		return loc, fmt.Errorf("blob %s: in no pack of the store: %w", id, errdefs.ErrNotFound)
	}
	return loc, nil
}

// Report says what Verify read.
type Report struct {
	Checkpoint delta.ID
	Objects    []string // every store object read, sorted
	Trees      int64
	Chunks     int64
	Bytes      int64 // plaintext bytes checked
	// Entries and StateBytes are what restoring the checkpoint's trees
	// writes (shared subtrees counted each time they appear).
	Entries    uint64
	StateBytes uint64
	// BaseChecked says the base materialised on this host was re-hashed
	// (set by the engine, which knows the backends).
	BaseChecked bool
	// FrozenChecked says this host's frozen layer of the checkpoint's
	// tree, which its branches stack on, was re-hashed (engine too).
	FrozenChecked bool
}

// Verify reads every object checkpoint cp needs and checks every hash: the
// record against its id, each pack against its name, each pack header
// against the locator's index, each blob's plaintext against its id, and
// each tree's canonical encoding (so the tree hashes are recomputed bottom
// up). It applies every rule a restore applies, through delta.CheckState
// (the same code), with each file's size checked against its chunks'
// lengths from the index. The first problem is returned as an error naming
// the object.
func (c *Checker) Verify(ctx context.Context, cp *delta.Checkpoint) (*Report, error) {
	rep := &Report{Checkpoint: cp.ID}
	recData, err := upload.ReadAllMax(ctx, c.Store, delta.RecordName(cp.ID), delta.MaxRecordSize)
	if err != nil {
		return rep, fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
	}
	rep.Objects = append(rep.Objects, delta.RecordName(cp.ID))
	if _, err := delta.DecodeRecord(cp.ID, recData); err != nil {
		return rep, fmt.Errorf("object %s: %w", delta.RecordName(cp.ID), err)
	}
	// Pass 1: the restore rules over every tree, learning where each blob
	// lives on the way.
	need := map[delta.ID]catalog.BlobLocation{}
	find := func(id delta.ID, t delta.BlobType) (catalog.BlobLocation, error) {
		if loc, ok := need[id]; ok {
			return loc, nil
		}
		loc, err := c.Locator.Locate(ctx, id)
		if err != nil {
			return loc, err
		}
		// Stored as the other type is the same bytes (content.Repo's
		// load), within this type's limit.
		if loc.Type != t && loc.RawLength > delta.MaxRawLength(t) {
			return loc, fmt.Errorf("blob %s: stored as a %d-byte %s, over the %s limit: %w", id, loc.RawLength, loc.Type, t, errdefs.ErrCorrupt)
		}
		need[id] = loc
		return loc, nil
	}
	tl := &locatingLoader{inner: c.Blobs, find: find}
	rules := delta.StateRules{ChunkSize: func(id delta.ID) (uint64, error) {
		loc, err := find(id, delta.BlobData)
		return loc.RawLength, err
	}}
	for i, root := range cp.Roots() {
		r := rules
		r.Plain = i != 1 // Roots: base, writable layer, process image
		fp, err := delta.CheckState(ctx, tl, root, r)
		if err != nil {
			return rep, fmt.Errorf("checkpoint %s: tree %s: %w", cp.ID.Short(), root.Short(), err)
		}
		rep.Entries += fp.Entries
		rep.StateBytes += fp.Bytes
	}
	for _, loc := range need {
		if loc.Type == delta.BlobTree {
			rep.Trees++
		} else {
			rep.Chunks++
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

// locatingLoader locates each tree before loading it, so Verify learns
// every tree's pack, and names that pack when a load fails.
type locatingLoader struct {
	inner delta.BlobLoader
	find  func(id delta.ID, t delta.BlobType) (catalog.BlobLocation, error)
}

func (l *locatingLoader) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	loc, err := l.find(id, t)
	if err != nil {
		return nil, err
	}
	b, err := l.inner.LoadBlob(ctx, t, id)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, delta.PackName(loc.Pack))
	}
	return b, nil
}

func (c *Checker) verifyPack(ctx context.Context, pack delta.ID, blobs []delta.ID, need map[delta.ID]catalog.BlobLocation, rep *Report) error {
	name := delta.PackName(pack)
	rep.Objects = append(rep.Objects, name)
	data, err := upload.ReadAllMax(ctx, c.Store, name, delta.MaxPackSize)
	if err != nil {
		return err
	}
	// A sealed pack is named by its bytes or, written by a home whose
	// local store is plaintext, by its plaintext layout (CheckPackName).
	if _, err := c.Keys.CheckPackName(c.IDs, pack, data); err != nil {
		return fmt.Errorf("object %s: %w", name, err)
	}
	entries, err := c.Keys.ParsePackHeader(data)
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
			return fmt.Errorf("object %s: header does not list blob %s where the index says: %w", name, id.Short(), errdefs.ErrCorrupt)
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
