package engine

import (
	"context"
	"fmt"
	"slices"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// VerifyReport says what Verify read.
type VerifyReport struct {
	Checkpoint delta.ID
	Objects    []string // every store object read, sorted
	Trees      int64
	Chunks     int64
	Bytes      int64 // plaintext bytes checked
	// Entries and StateBytes are what a restore of the checkpoint's trees
	// writes (shared subtrees counted each time they appear).
	Entries    uint64
	StateBytes uint64
	// BaseChecked says the base materialised on this host was re-hashed.
	BaseChecked bool
}

// locator says where a blob is stored: from the catalog, or (store-only
// verify) from the headers of every pack in the store.
type locator func(id delta.ID) (catalog.BlobLocation, bool, error)

// Verify reads every object checkpoint ref needs and checks every hash: the
// record against its id, each pack against its name, each pack header
// against the catalog's index, each blob's plaintext against its id, and each
// tree's canonical encoding (so the tree hashes are recomputed bottom up).
// It applies every rule a restore applies, through delta.CheckState, and
// re-hashes the base this host has materialised for the checkpoint. The
// first problem is returned as an error naming the object.
func (e *Engine) Verify(ctx context.Context, ref string) (*VerifyReport, error) {
	cp, err := e.resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	locate := func(id delta.ID) (loc catalog.BlobLocation, ok bool, err error) {
		err = e.view(ctx, func(tx *catalog.Tx) error {
			loc, ok, err = tx.Blob(id)
			return err
		})
		return loc, ok, err
	}
	rep, err := e.verifyCheckpoint(ctx, cp.ID, locate, e.repo)
	if err != nil {
		return rep, err
	}
	checked, err := e.checkBase(ctx, cp.Sandbox, cp.Backend, cp.BaseTree, true)
	if err != nil {
		return rep, fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
	}
	rep.BaseChecked = checked
	return rep, nil
}

// verifyCheckpoint checks the record id and everything it references,
// locating blobs with locate and reading trees through loader.
func (e *Engine) verifyCheckpoint(ctx context.Context, id delta.ID, locate locator, loader delta.BlobLoader) (*VerifyReport, error) {
	rep := &VerifyReport{Checkpoint: id}
	recData, err := upload.ReadAllMax(ctx, e.store, recordName(id), catalog.MaxRecordSize)
	if err != nil {
		return rep, fmt.Errorf("checkpoint %s: %w", id.Short(), err)
	}
	rep.Objects = append(rep.Objects, recordName(id))
	cp, err := catalog.DecodeRecord(id, recData)
	if err != nil {
		return rep, fmt.Errorf("object %s: %w", recordName(id), err)
	}
	// Pass 1: the restore rules over every tree, learning where each blob
	// lives on the way.
	need := map[delta.ID]catalog.BlobLocation{}
	find := func(id delta.ID, t delta.BlobType) (catalog.BlobLocation, error) {
		if loc, ok := need[id]; ok {
			return loc, nil
		}
		loc, ok, err := locate(id)
		if err != nil {
			return loc, fmt.Errorf("blob %s: %w", id.Short(), err)
		}
		if !ok {
			return loc, fmt.Errorf("blob %s: in no known pack: %w", id, errdefs.ErrNotFound)
		}
		if loc.Type != t {
			return loc, fmt.Errorf("blob %s: stored as %s, needed as %s: %w", id, loc.Type, t, errdefs.ErrCorrupt)
		}
		need[id] = loc
		return loc, nil
	}
	tl := &locatingLoader{inner: loader, find: find}
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
		if err := e.verifyPack(ctx, pack, blobs, need, rep); err != nil {
			return rep, fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
		}
	}
	slices.Sort(rep.Objects)
	return rep, nil
}

// locatingLoader locates each tree before loading it, so verify learns every
// tree's pack, and names that pack when a load fails.
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
		return nil, fmt.Errorf("%w (in %s)", err, upload.PackName(loc.Pack))
	}
	return b, nil
}

func (e *Engine) verifyPack(ctx context.Context, pack delta.ID, blobs []delta.ID, need map[delta.ID]catalog.BlobLocation, rep *VerifyReport) error {
	name := upload.PackName(pack)
	rep.Objects = append(rep.Objects, name)
	data, err := upload.ReadAllMax(ctx, e.store, name, upload.MaxPackSize)
	if err != nil {
		return err
	}
	if got := delta.Hash(data); got != pack {
		return fmt.Errorf("object %s: content hashes to %s: %w", name, got.Short(), errdefs.ErrCorrupt)
	}
	entries, err := upload.ParsePackHeader(data)
	if err != nil {
		return fmt.Errorf("object %s: %w", name, err)
	}
	inHeader := make(map[delta.ID]upload.PackEntry, len(entries))
	for _, en := range entries {
		inHeader[en.ID] = en
	}
	for _, id := range blobs {
		loc := need[id]
		en, ok := inHeader[id]
		if !ok || locationOf(pack, en) != loc {
			return fmt.Errorf("object %s: header does not list blob %s where the index says: %w", name, id.Short(), errdefs.ErrCorrupt)
		}
		plain, err := e.repo.decode(id, name, loc, data[loc.Offset:loc.Offset+loc.Length])
		if err != nil {
			return err
		}
		rep.Bytes += int64(len(plain))
	}
	return nil
}

// baseChecker is a backend that keeps materialised bases on this host.
type baseChecker interface {
	CheckBase(ctx context.Context, tree delta.ID, full bool) (bool, error)
}

// checkBase re-hashes the base tree as this host has it for backend, and
// reports whether it had one. Restores pass full=false (a stat per entry),
// verify full=true.
func (e *Engine) checkBase(ctx context.Context, sandbox, backend string, tree delta.ID, full bool) (bool, error) {
	var cfg map[string]string
	e.view(ctx, func(tx *catalog.Tx) error {
		if sb, err := tx.Sandbox(sandbox); err == nil && sb.Backend == backend {
			cfg = sb.Config
		}
		return nil
	})
	be, err := e.backend(backend, cfg)
	if err != nil {
		return false, nil // a backend this host cannot run has no base here
	}
	return checkBaseOn(ctx, be, tree, full)
}

func checkBaseOn(ctx context.Context, be Backend, tree delta.ID, full bool) (bool, error) {
	bc, ok := be.(baseChecker)
	if !ok {
		return false, nil
	}
	return bc.CheckBase(ctx, tree, full)
}
