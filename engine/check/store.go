package check

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/content"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// StoreReport says what VerifyStore checked.
type StoreReport struct {
	Packs       int       `json:"packs"`
	Blobs       int       `json:"blobs"`
	Refs        int       `json:"refs"`
	Checkpoints []*Report `json:"checkpoints"`
}

// VerifyStore checks the store without the catalog, the way restic's
// checker does: it indexes every blob by reading every pack's header, then
// verifies checkpoint ref (a full or unique-prefix ID, or a tag), or every
// record if ref is zero, exactly as Verify does, and checks that every
// head and tag names a record the store holds. It is the oracle for a store
// whose catalog may be wrong or gone.
func (v *Verifier) VerifyStore(ctx context.Context, ref catalog.CheckpointRef) (*StoreReport, error) {
	rep := &StoreReport{}
	store, keys, repo := v.d.Store(), v.d.Keys(), v.d.Repo()
	index := map[delta.ID]catalog.BlobLocation{}
	err := store.List(ctx, delta.PackPrefix, func(oi upload.ObjectInfo) error {
		id, ok := delta.ParsePackName(oi.Name)
		if !ok {
			return nil // not ours; leave it
		}
		entries, err := keys.ReadPackHeader(ctx, upload.Ranges(store), oi.Name)
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
	err = store.List(ctx, delta.RecordPrefix, func(oi upload.ObjectInfo) error {
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
	if err := checkRefObjects(ctx, store, records, rep); err != nil {
		return rep, err
	}
	todo := records
	if !ref.IsZero() {
		id, err := ResolveInStore(ctx, store, v.d.HomeID(), ref, records)
		if err != nil {
			return rep, err
		}
		todo = []delta.ID{id}
	}
	ck := &Checker{Store: store, Blobs: indexBlobs{repo.LoaderFor(index), repo}, Locator: MapLocator(index), Keys: keys, IDs: v.d.IDs()}
	for _, id := range todo {
		data, err := upload.ReadAllMax(ctx, store, delta.RecordName(id), delta.MaxRecordSize)
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
	repo Blobs
}

func (b indexBlobs) Decode(id delta.ID, object string, loc catalog.BlobLocation, stored []byte) ([]byte, error) {
	return b.repo.Decode(id, object, loc, stored)
}

// checkRefObjects checks that every head and tag object names a record.
func checkRefObjects(ctx context.Context, store upload.Store, records []delta.ID, rep *StoreReport) error {
	for _, prefix := range []string{delta.HeadPrefix, delta.TagPrefix} {
		err := store.List(ctx, prefix, func(oi upload.ObjectInfo) error {
			data, err := upload.ReadAllMax(ctx, store, oi.Name, delta.MaxSmallObject)
			if err != nil {
				return err
			}
			id, err := delta.ParseRef(data)
			if err != nil {
				return fmt.Errorf("object %s: %v: %w", oi.Name, err, errdefs.ErrCorrupt)
			}
			if _, ok := slices.BinarySearchFunc(records, id, compareIDs); !ok {
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

func compareIDs(a, b delta.ID) int { return strings.Compare(a.String(), b.String()) }

// ResolveInStore finds ref among the store's records (sorted by
// compareIDs) by the catalog's rules (catalog.ResolveIn): a unique ID
// prefix of at least catalog.MinPrefixLen digits, a tag object, or
// NAME@HEAD (the head object of the sandbox of that name), each with an
// optional ~N walked through the store's records. With no catalog there is
// no sandbox in context: a bare HEAD is invalid. homeID picks this home's
// sandbox among several of one name.
func ResolveInStore(ctx context.Context, store upload.Store, homeID string, ref catalog.CheckpointRef, records []delta.ID) (delta.ID, error) {
	return catalog.ResolveIn(storeRefs{ctx, store, homeID, records}, "", ref)
}

// storeRefs is a store read without a catalog as a catalog.RefSource.
type storeRefs struct {
	ctx     context.Context
	store   upload.Store
	homeID  string
	records []delta.ID
}

func (s storeRefs) has(id delta.ID) bool {
	_, ok := slices.BinarySearchFunc(s.records, id, compareIDs)
	return ok
}

func (s storeRefs) Checkpoint(id delta.ID) (*delta.Checkpoint, error) {
	if !s.has(id) {
		return nil, fmt.Errorf("checkpoint %s: no such record in the store: %w", id.Short(), errdefs.ErrNotFound)
	}
	data, err := upload.ReadAllMax(s.ctx, s.store, delta.RecordName(id), delta.MaxRecordSize)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", id.Short(), err)
	}
	cp, err := delta.DecodeRecord(id, data)
	if err != nil {
		return nil, fmt.Errorf("object %s: %w", delta.RecordName(id), err)
	}
	return cp, nil
}

func (s storeRefs) MatchPrefix(p string, limit int) ([]delta.ID, error) {
	var found []delta.ID
	for _, id := range s.records {
		if strings.HasPrefix(id.String(), p) {
			if found = append(found, id); len(found) >= limit {
				break
			}
		}
	}
	return found, nil
}

// Tag reads a tag object.
func (s storeRefs) Tag(name string) (delta.ID, bool, error) {
	tag := delta.TagPrefix + name
	data, err := upload.ReadAllMax(s.ctx, s.store, tag, delta.MaxSmallObject)
	if errors.Is(err, errdefs.ErrNotFound) {
		return delta.ID{}, false, nil
	}
	if err != nil {
		return delta.ID{}, false, err
	}
	id, err := delta.ParseRef(data)
	if err != nil {
		return delta.ID{}, false, fmt.Errorf("object %s: %w", tag, err)
	}
	// A tag another home's prune left dangling is named as such, not as a
	// record that vanished mid-verify.
	if !s.has(id) {
		return delta.ID{}, false, fmt.Errorf("object %s: names checkpoint %s, which the store lacks: %w", tag, id.Short(), errdefs.ErrNotFound)
	}
	return id, true, nil
}

// Head finds the head of the sandbox labelled name. Head objects
// are named by sandbox key, not label (and a fresh branch's head is
// another sandbox's checkpoint), so the label is looked up in the
// sandboxes' descriptions. Two sandboxes of one label (homes sharing the
// bucket) resolve to this home's, as a rebuild names them, or are
// ambiguous.
func (s storeRefs) Head(name delta.SandboxName) (delta.ID, error) {
	ctx, store := s.ctx, s.store
	var found []*delta.Sandbox
	err := store.List(ctx, delta.SandboxPrefix, func(oi upload.ObjectInfo) error {
		data, err := upload.ReadAllMax(ctx, store, oi.Name, delta.MaxSmallObject)
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
		found = slices.DeleteFunc(found, func(sb *delta.Sandbox) bool { return sb.Home == "" || sb.Home != s.homeID })
		if len(found) != 1 {
			return delta.ID{}, fmt.Errorf("several sandboxes named %s are in the store, none of them this home's: name the checkpoint by ID: %w",
				name, errdefs.ErrInvalid)
		}
	}
	if len(found) == 0 {
		return delta.ID{}, fmt.Errorf("no sandbox %s in the store: %w", name, errdefs.ErrNotFound)
	}
	head := delta.HeadObject(found[0].Key())
	data, err := upload.ReadAllMax(ctx, store, head, delta.MaxSmallObject)
	if err != nil {
		return delta.ID{}, fmt.Errorf("sandbox %s: %w", name, err)
	}
	id, err := delta.ParseRef(data)
	if err != nil {
		return delta.ID{}, fmt.Errorf("object %s: %v: %w", head, err, errdefs.ErrCorrupt)
	}
	return id, nil
}
