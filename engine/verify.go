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
}

// Verify reads every object checkpoint ref needs and checks every hash: the
// record against its id, each pack against its name, each pack header
// against the catalog's index, each blob's plaintext against its id, and each
// tree's canonical encoding (so the tree hashes are recomputed bottom up).
// The first problem is returned as an error naming the object.
func (e *Engine) Verify(ctx context.Context, ref string) (*VerifyReport, error) {
	cp, err := e.resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	rep := &VerifyReport{Checkpoint: cp.ID}
	recData, err := upload.ReadAll(ctx, e.store, recordName(cp.ID))
	if err != nil {
		return rep, fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
	}
	rep.Objects = append(rep.Objects, recordName(cp.ID))
	if _, err := catalog.DecodeRecord(cp.ID, recData); err != nil {
		return rep, fmt.Errorf("object %s: %w", recordName(cp.ID), err)
	}
	// Pass 1: walk the trees to learn every blob and where it lives.
	need := map[delta.ID]catalog.BlobLocation{}
	var walk func(id delta.ID) error
	walk = func(id delta.ID) error {
		if _, ok := need[id]; ok {
			return nil
		}
		if err := e.locate(ctx, id, need); err != nil {
			return err
		}
		t, err := delta.LoadTree(ctx, e.repo, id)
		if err != nil {
			return fmt.Errorf("%w (in %s)", err, upload.PackName(need[id].Pack))
		}
		rep.Trees++
		for _, en := range t.Entries {
			switch en.Type {
			case delta.TypeDir:
				if err := walk(en.Subtree); err != nil {
					return err
				}
			case delta.TypeFile:
				for _, c := range en.Chunks {
					if _, ok := need[c]; !ok {
						if err := e.locate(ctx, c, need); err != nil {
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
		if err := e.verifyPack(ctx, pack, blobs, need, rep); err != nil {
			return rep, fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
		}
	}
	// The files must also be restorable: the device-node rule restore applies.
	if err := checkDevices(ctx, e.repo, cp.FSTree); err != nil {
		return rep, fmt.Errorf("checkpoint %s: files not restorable: %w", cp.ID.Short(), err)
	}
	slices.Sort(rep.Objects)
	return rep, nil
}

func (e *Engine) locate(ctx context.Context, id delta.ID, need map[delta.ID]catalog.BlobLocation) error {
	return e.view(ctx, func(tx *catalog.Tx) error {
		loc, ok, err := tx.Blob(id)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("blob %s: in no known pack: %w", id, errdefs.ErrNotFound)
		}
		need[id] = loc
		return nil
	})
}

func (e *Engine) verifyPack(ctx context.Context, pack delta.ID, blobs []delta.ID, need map[delta.ID]catalog.BlobLocation, rep *VerifyReport) error {
	name := upload.PackName(pack)
	rep.Objects = append(rep.Objects, name)
	data, err := upload.ReadAll(ctx, e.store, name)
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
			return fmt.Errorf("object %s: header does not list blob %s where the catalog says: %w", name, id.Short(), errdefs.ErrCorrupt)
		}
		plain, err := e.repo.decode(id, name, loc, data[loc.Offset:loc.Offset+loc.Length])
		if err != nil {
			return err
		}
		rep.Bytes += int64(len(plain))
	}
	return nil
}
