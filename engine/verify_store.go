package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/check"
	"github.com/turnsnap/turnsnap/engine/content"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// StoreReport says what VerifyStore checked.
type StoreReport struct {
	Packs       int             `json:"packs"`
	Blobs       int             `json:"blobs"`
	Refs        int             `json:"refs"`
	Checkpoints []*VerifyReport `json:"checkpoints"`
}

// VerifyStore checks the store without the catalog, the way restic's
// checker does: it indexes every blob by reading every pack's header, then
// verifies checkpoint ref (a full or unique-prefix ID, or a tag), or every
// record if ref is empty, exactly as Verify does, and checks that every
// head and tag names a record the store holds. It is the oracle for a store
// whose catalog may be wrong or gone.
func (e *Engine) VerifyStore(ctx context.Context, ref string) (*StoreReport, error) {
	rep := &StoreReport{}
	index := map[delta.ID]catalog.BlobLocation{}
	err := e.store.List(ctx, delta.PackPrefix, func(oi upload.ObjectInfo) error {
		id, ok := delta.ParsePackName(oi.Name)
		if !ok {
			return nil // not ours; leave it
		}
		entries, err := e.localKeys().ReadPackHeader(ctx, upload.Ranges(e.store), oi.Name)
		if err != nil {
			return err
		}
		rep.Packs++
		for _, en := range entries {
			index[en.ID] = content.LocationOf(id, en) // any copy is valid
		}
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("verify store: packs: %w", err)
	}
	rep.Blobs = len(index)
	var records []delta.ID
	err = e.store.List(ctx, delta.RecordPrefix, func(oi upload.ObjectInfo) error {
		id, err := delta.ParseID(strings.TrimPrefix(oi.Name, delta.RecordPrefix))
		if err != nil || delta.RecordName(id) != oi.Name {
			return fmt.Errorf("object %s: not a record name: %w", oi.Name, errdefs.ErrCorrupt)
		}
		records = append(records, id)
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("verify store: records: %w", err)
	}
	slices.SortFunc(records, func(a, b delta.ID) int { return strings.Compare(a.String(), b.String()) })
	if err := e.checkRefObjects(ctx, records, rep); err != nil {
		return rep, err
	}
	todo := records
	if ref != "" {
		id, err := e.resolveInStore(ctx, ref, records)
		if err != nil {
			return rep, err
		}
		todo = []delta.ID{id}
	}
	ck := &check.Checker{Store: e.store, Blobs: indexBlobs{e.repo.LoaderFor(index), e.repo}, Locator: check.MapLocator(index), Keys: e.localKeys(), IDs: e.ids()}
	for _, id := range todo {
		data, err := upload.ReadAllMax(ctx, e.store, delta.RecordName(id), delta.MaxRecordSize)
		if err != nil {
			return rep, fmt.Errorf("checkpoint %s: %w", id.Short(), err)
		}
		cp, err := delta.DecodeRecord(id, data)
		if err != nil {
			return rep, fmt.Errorf("object %s: %w", delta.RecordName(id), err)
		}
		r, err := ck.Verify(ctx, cp)
		if err != nil {
			return rep, err
		}
		rep.Checkpoints = append(rep.Checkpoints, r)
	}
	return rep, nil
}

// indexBlobs reads blobs located by a pack-header index, never the catalog.
type indexBlobs struct {
	delta.BlobLoader
	repo *content.Repo
}

func (b indexBlobs) Decode(id delta.ID, object string, loc catalog.BlobLocation, stored []byte) ([]byte, error) {
	return b.repo.Decode(id, object, loc, stored)
}

// checkRefObjects checks that every head and tag object names a record.
func (e *Engine) checkRefObjects(ctx context.Context, records []delta.ID, rep *StoreReport) error {
	for _, prefix := range []string{delta.HeadPrefix, delta.TagPrefix} {
		err := e.store.List(ctx, prefix, func(oi upload.ObjectInfo) error {
			data, err := upload.ReadAllMax(ctx, e.store, oi.Name, delta.MaxSmallObject)
			if err != nil {
				return err
			}
			id, err := delta.ParseRef(data)
			if err != nil {
				return fmt.Errorf("object %s: %v: %w", oi.Name, err, errdefs.ErrCorrupt)
			}
			if _, ok := slices.BinarySearchFunc(records, id, func(a, b delta.ID) int { return strings.Compare(a.String(), b.String()) }); !ok {
				return fmt.Errorf("object %s: names checkpoint %s, which the store lacks: %w", oi.Name, id.Short(), errdefs.ErrCorrupt)
			}
			rep.Refs++
			return nil
		})
		if err != nil {
			return fmt.Errorf("verify store: refs: %w", err)
		}
	}
	return nil
}

// resolveInStore finds ref among the store's records: a tag object, or a
// unique ID prefix of at least 4 digits.
func (e *Engine) resolveInStore(ctx context.Context, ref string, records []delta.ID) (delta.ID, error) {
	if delta.ValidName(ref) {
		tag := delta.TagPrefix + ref
		data, err := upload.ReadAllMax(ctx, e.store, tag, delta.MaxSmallObject)
		switch {
		case err == nil:
			id, err := delta.ParseRef(data)
			if err != nil {
				return delta.ID{}, fmt.Errorf("object %s: %w", tag, err)
			}
			// A tag another home's prune left dangling is named as such,
			// not as a record that vanished mid-verify.
			if _, ok := slices.BinarySearchFunc(records, id, func(a, b delta.ID) int { return strings.Compare(a.String(), b.String()) }); !ok {
				return delta.ID{}, fmt.Errorf("object %s: names checkpoint %s, which the store lacks: %w", tag, id.Short(), errdefs.ErrNotFound)
			}
			return id, nil
		case !errors.Is(err, errdefs.ErrNotFound):
			return delta.ID{}, err
		}
	}
	var found []delta.ID
	if len(ref) >= 4 {
		for _, id := range records {
			if strings.HasPrefix(id.String(), strings.ToLower(ref)) {
				found = append(found, id)
			}
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return delta.ID{}, fmt.Errorf("checkpoint %q: no such record or tag in the store: %w", ref, errdefs.ErrNotFound)
	}
	return delta.ID{}, fmt.Errorf("checkpoint %q: prefix matches %d records: %w", ref, len(found), errdefs.ErrInvalid)
}
