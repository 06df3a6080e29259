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

// resolveInStore finds ref among the store's records with the catalog's
// grammar (catalog.ParseCheckpointRef): a tag object, a unique ID prefix
// of at least 4 digits, or NAME@HEAD (the head object of the sandbox of
// that name), each with an optional ~N walked through the store's records.
// With no catalog there is no sandbox in context: a bare HEAD is invalid.
func (e *Engine) resolveInStore(ctx context.Context, ref string, records []delta.ID) (delta.ID, error) {
	r, err := catalog.ParseCheckpointRef(ref)
	if err != nil {
		return delta.ID{}, err
	}
	get := func(id delta.ID) (*delta.Checkpoint, error) {
		if _, ok := slices.BinarySearchFunc(records, id, func(a, b delta.ID) int { return strings.Compare(a.String(), b.String()) }); !ok {
			return nil, fmt.Errorf("checkpoint %s: no such record in the store: %w", id.Short(), errdefs.ErrNotFound)
		}
		data, err := upload.ReadAllMax(ctx, e.store, delta.RecordName(id), delta.MaxRecordSize)
		if err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", id.Short(), err)
		}
		cp, err := delta.DecodeRecord(id, data)
		if err != nil {
			return nil, fmt.Errorf("object %s: %w", delta.RecordName(id), err)
		}
		return cp, nil
	}
	var id delta.ID
	switch {
	case r.Head && r.Sandbox == "":
		return delta.ID{}, fmt.Errorf("checkpoint %q: verify names no sandbox whose HEAD it could be: write NAME@HEAD: %w",
			ref, errdefs.ErrInvalid)
	case r.Head:
		if id, err = e.headInStore(ctx, r.Sandbox); err != nil {
			return delta.ID{}, fmt.Errorf("checkpoint %q: %w", ref, err)
		}
	default:
		if id, err = e.baseInStore(ctx, r.Base, records); err != nil {
			return delta.ID{}, err
		}
	}
	return catalog.WalkBack(ref, id, r.Back, get)
}

// baseInStore resolves a tag object or a unique ID prefix.
func (e *Engine) baseInStore(ctx context.Context, ref string, records []delta.ID) (delta.ID, error) {
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

// headInStore finds the head of the sandbox labelled name. Head objects
// are named by sandbox key, not label (and a fresh branch's head is
// another sandbox's checkpoint), so the label is looked up in the
// sandboxes' descriptions. Two sandboxes of one label (homes sharing the
// bucket) resolve to this home's, as a rebuild names them, or are
// ambiguous.
func (e *Engine) headInStore(ctx context.Context, name string) (delta.ID, error) {
	var found []*delta.Sandbox
	err := e.store.List(ctx, delta.SandboxPrefix, func(oi upload.ObjectInfo) error {
		data, err := upload.ReadAllMax(ctx, e.store, oi.Name, delta.MaxSmallObject)
		if err != nil {
			return err
		}
		sb, err := delta.DecodeSandbox(oi.Name, data)
		if err != nil {
			return err
		}
		if sb.Name == name {
			found = append(found, sb)
		}
		return nil
	})
	if err != nil {
		return delta.ID{}, err
	}
	if len(found) > 1 {
		found = slices.DeleteFunc(found, func(sb *delta.Sandbox) bool { return sb.Home == "" || sb.Home != e.config.HomeID })
		if len(found) != 1 {
			return delta.ID{}, fmt.Errorf("several sandboxes named %s are in the store, none of them this home's: name the checkpoint by ID: %w",
				name, errdefs.ErrInvalid)
		}
	}
	if len(found) == 0 {
		return delta.ID{}, fmt.Errorf("no sandbox %s in the store: %w", name, errdefs.ErrNotFound)
	}
	head := delta.RefName(delta.RefHead, found[0].Key())
	data, err := upload.ReadAllMax(ctx, e.store, head, delta.MaxSmallObject)
	if err != nil {
		return delta.ID{}, fmt.Errorf("sandbox %s: %w", name, err)
	}
	id, err := delta.ParseRef(data)
	if err != nil {
		return delta.ID{}, fmt.Errorf("object %s: %v: %w", head, err, errdefs.ErrCorrupt)
	}
	return id, nil
}
