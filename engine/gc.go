package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// DefaultGCGrace protects packs younger than this even when nothing
// references them yet: a checkpoint being committed on this host writes its
// packs before its record. An hour is far longer than any commit.
const DefaultGCGrace = time.Hour

// GCOptions configures GC.
type GCOptions struct {
	Grace  time.Duration // 0 means DefaultGCGrace; negative means none (tests)
	DryRun bool
}

// GCReport says what GC found and did.
type GCReport struct {
	Records        int   `json:"records"`
	LiveBlobs      int   `json:"live_blobs"`
	Packs          int   `json:"packs"`
	Deleted        int   `json:"deleted_packs"`
	DeletedBytes   int64 `json:"deleted_bytes"`
	KeptYoung      int   `json:"kept_young_packs"`
	PartlyLive     int   `json:"partly_live_packs"`
	DeadBytesKept  int64 `json:"dead_bytes_in_live_packs"`
	DryRun         bool  `json:"dry_run"`
	DurationMillis int64 `json:"duration_ms"`
}

// GC deletes packs that no checkpoint references, locally and in the
// bucket. It marks from every record it can see (the bucket's and this
// host's, including records not uploaded yet) and holds the bucket's gc
// lock, so no host uploads meanwhile; a pack is deleted only if no blob in
// it is live and it is older than the grace period. Packs with some live
// blobs are kept whole (their dead bytes are reported; repacking is future
// work).
func (e *Engine) GC(ctx context.Context, opts GCOptions) (*GCReport, error) {
	start := time.Now()
	grace := opts.Grace
	if grace == 0 {
		grace = DefaultGCGrace
	}
	rep := &GCReport{DryRun: opts.DryRun}
	if e.remote != nil {
		lock, err := e.lockRemote(ctx, "gc")
		if err != nil {
			return nil, err
		}
		defer lock.release(ctx)
	}
	// Every pack's header: where each blob lives, on this host or not.
	type packInfo struct {
		info    upload.ObjectInfo
		entries []upload.PackEntry
	}
	packs := map[delta.ID]*packInfo{}
	locs := map[delta.ID]catalog.BlobLocation{}
	err := e.store.List(ctx, upload.PackPrefix, func(oi upload.ObjectInfo) error {
		id, ok := upload.ParsePackName(oi.Name)
		if !ok {
			return nil
		}
		entries, err := e.readPackHeader(ctx, oi.Name)
		if err != nil {
			return err
		}
		packs[id] = &packInfo{info: oi, entries: entries}
		for _, en := range entries {
			locs[en.ID] = locationOf(id, en)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gc: packs: %w", err)
	}
	rep.Packs = len(packs)
	// Mark.
	live := map[delta.ID]bool{}
	w := &walker{loader: e.loaderFor(locs), seen: live, visit: func(delta.ID, delta.BlobType) error { return nil }}
	err = e.store.List(ctx, recordPrefix, func(oi upload.ObjectInfo) error {
		id, err := delta.ParseID(strings.TrimPrefix(oi.Name, recordPrefix))
		if err != nil {
			return nil
		}
		data, err := upload.ReadAll(ctx, e.store, oi.Name)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil // pruned since the listing: it protects nothing any more
		}
		if err != nil {
			return err
		}
		cp, err := catalog.DecodeRecord(id, data)
		if err != nil {
			return fmt.Errorf("object %s: %w", oi.Name, err)
		}
		rep.Records++
		for _, root := range cp.Roots() {
			if err := w.walk(ctx, root); err != nil {
				return fmt.Errorf("checkpoint %s: %w", id.Short(), err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gc: mark: %w", err)
	}
	rep.LiveBlobs = len(live)
	// Sweep.
	ids := make([]delta.ID, 0, len(packs))
	for id := range packs {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b delta.ID) int { return strings.Compare(a.String(), b.String()) })
	for _, id := range ids {
		p := packs[id]
		var liveN int
		var dead int64
		for _, en := range p.entries {
			if live[en.ID] {
				liveN++
			} else {
				dead += int64(en.Length)
			}
		}
		switch {
		case liveN > 0:
			if dead > 0 {
				rep.PartlyLive++
				rep.DeadBytesKept += dead
			}
			continue
		case grace > 0 && time.Since(p.info.ModTime) < grace:
			rep.KeptYoung++
			continue
		}
		rep.Deleted++
		rep.DeletedBytes += p.info.Size
		if opts.DryRun {
			continue
		}
		if err := e.deletePack(ctx, id, p.entries); err != nil {
			return rep, err
		}
	}
	rep.DurationMillis = time.Since(start).Milliseconds()
	return rep, nil
}

// deletePack removes a pack from the bucket first, then locally, then from
// the catalog's blob index (only entries that point at this pack: another
// copy of a blob may live elsewhere).
func (e *Engine) deletePack(ctx context.Context, id delta.ID, entries []upload.PackEntry) error {
	name := upload.PackName(id)
	if e.remote != nil {
		if err := e.remote.Delete(ctx, name); err != nil {
			return fmt.Errorf("gc: delete %s: %w", name, err)
		}
	}
	if err := e.local.Delete(ctx, name); err != nil {
		return fmt.Errorf("gc: delete %s: %w", name, err)
	}
	return e.cat.Update(ctx, func(tx *catalog.Tx) error {
		// A pruned checkpoint's packs may still be queued for upload.
		if err := dequeue(tx, "", name); err != nil {
			return err
		}
		for _, en := range entries {
			loc, ok, err := tx.Blob(en.ID)
			if err != nil {
				return err
			}
			if ok && loc.Pack == id {
				if err := tx.DeleteBlob(en.ID); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// PruneOptions configures Prune.
type PruneOptions struct {
	KeepLast int // per sandbox, newest first; at least 1
	DryRun   bool
}

// PruneReport lists what Prune removed.
type PruneReport struct {
	Kept    int        `json:"kept"`
	Deleted []delta.ID `json:"deleted"`
}

// Prune deletes checkpoints beyond the newest KeepLast of each sandbox,
// keeping every head and every tagged checkpoint. A kept checkpoint needs no
// ancestor: each names its whole state (base tree and writable-layer tree),
// so nothing is replayed on restore and pruning an ancestor only shortens
// the log. Records go from the bucket, the local store and the catalog;
// run gc afterwards to reclaim the packs nothing references any more.
func (e *Engine) Prune(ctx context.Context, opts PruneOptions) (*PruneReport, error) {
	if opts.KeepLast < 1 {
		return nil, fmt.Errorf("prune: --keep-last must be at least 1: %w", errdefs.ErrInvalid)
	}
	keep := map[delta.ID]bool{}
	bySandbox := map[string][]*catalog.Checkpoint{}
	err := e.view(ctx, func(tx *catalog.Tx) error {
		for _, kind := range []catalog.RefKind{catalog.RefHead, catalog.RefTag} {
			refs, err := tx.Refs(kind)
			if err != nil {
				return err
			}
			for _, r := range refs {
				keep[r.Target] = true
			}
		}
		return tx.ForEachCheckpoint(func(cp *catalog.Checkpoint) error {
			bySandbox[cp.Sandbox] = append(bySandbox[cp.Sandbox], cp)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	rep := &PruneReport{}
	var drop []*catalog.Checkpoint
	for _, cps := range bySandbox {
		slices.SortFunc(cps, func(a, b *catalog.Checkpoint) int { return b.Created.Compare(a.Created) })
		for i, cp := range cps {
			if i < opts.KeepLast || keep[cp.ID] {
				rep.Kept++
				continue
			}
			drop = append(drop, cp)
		}
	}
	for _, cp := range drop {
		rep.Deleted = append(rep.Deleted, cp.ID)
		if opts.DryRun {
			continue
		}
		if err := e.deleteCheckpoint(ctx, cp); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// deleteCheckpoint removes one record everywhere and releases its
// references: bucket first (so another host's gc cannot keep seeing it),
// then the local store, then the catalog with its refcounts.
func (e *Engine) deleteCheckpoint(ctx context.Context, cp *catalog.Checkpoint) error {
	name := recordName(cp.ID)
	if e.remote != nil {
		if err := e.remote.Delete(ctx, name); err != nil {
			return fmt.Errorf("checkpoint %s: delete remote record: %w", cp.ID.Short(), err)
		}
	}
	if err := e.local.Delete(ctx, name); err != nil {
		return fmt.Errorf("checkpoint %s: delete record: %w", cp.ID.Short(), err)
	}
	err := e.cat.Update(ctx, func(tx *catalog.Tx) error {
		if err := dequeue(tx, cp.Sandbox, name); err != nil {
			return err
		}
		return tx.DeleteCheckpoint(cp.ID)
	})
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
	}
	return e.releaseRefs(ctx, cp.Roots())
}

// releaseRefs drops one reference to each root and cascades into the
// children of trees whose count reaches zero, the mirror of how commits
// count (a tree counts its children once, when it is first stored).
func (e *Engine) releaseRefs(ctx context.Context, roots []delta.ID) error {
	for len(roots) > 0 {
		id := roots[len(roots)-1]
		roots = roots[:len(roots)-1]
		var n int64
		err := e.cat.Update(ctx, func(tx *catalog.Tx) (err error) {
			n, err = tx.AddRefCount(id, -1)
			return err
		})
		if err != nil {
			if errors.Is(err, errdefs.ErrPrecondition) {
				continue // already zero: counts are a hint, gc decides by marking
			}
			return err
		}
		if n > 0 {
			continue
		}
		data, err := e.repo.LoadBlob(ctx, delta.BlobTree, id)
		if err != nil {
			continue // a chunk, or a tree we cannot read: nothing to cascade
		}
		t, err := delta.DecodeTree(data)
		if err != nil {
			return err
		}
		for _, en := range t.Entries {
			switch en.Type {
			case delta.TypeDir:
				roots = append(roots, en.Subtree)
			case delta.TypeFile:
				roots = append(roots, en.Chunks...)
			}
		}
	}
	return nil
}

// dequeue drops queued uploads of an object that no longer needs uploading
// (sandbox "" searches every sandbox's queue).
func dequeue(tx *catalog.Tx, sandbox, name string) error {
	pending, err := tx.PendingUploads(sandbox)
	if err != nil {
		return err
	}
	for _, p := range pending {
		if p.Name == name {
			if err := tx.UploadDone(p); err != nil {
				return err
			}
		}
	}
	return nil
}
