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
	"github.com/turnsnap/turnsnap/engine/content"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// DefaultGCGrace protects packs younger than this even when nothing
// references them yet: a checkpoint being committed on this host writes its
// packs before its record. An hour is far longer than any commit.
const DefaultGCGrace = time.Hour

// PhaseGCLocked is reached when a gc holds the bucket's gc lock and is
// about to list packs (Options.AtPhase): tests kill gc there.
const PhaseGCLocked = "gc-locked"

// GCOptions configures GC.
type GCOptions struct {
	// Grace keeps packs younger than this. 0 (or negative) keeps none: the
	// caller asks for DefaultGCGrace explicitly (the CLI's default).
	Grace  time.Duration
	DryRun bool
}

// GCReport says what GC found and did.
type GCReport struct {
	Records        int     `json:"records"`
	RecordsSwept   int     `json:"records_swept"` // this home's marked records deleted first (their grace is over)
	LiveBlobs      int     `json:"blobs_live"`
	Packs          int     `json:"packs"`
	Deleted        int     `json:"packs_deleted"`
	DeletedBytes   int64   `json:"bytes_deleted"`
	KeptYoung      int     `json:"packs_kept_young"`
	PartlyLive     int     `json:"packs_partly_live"`
	DeadBytesKept  int64   `json:"bytes_dead_kept"`
	DryRun         bool    `json:"dry_run"`
	DurationMillis float64 `json:"duration_ms"` // milliseconds, as every command's duration_ms
}

// GC deletes packs that no checkpoint references, locally and in the
// bucket. With a remote it first sweeps the records this home's prune or
// forget marked and whose grace is over (sweepLocked). It marks from every record it can see (the bucket's and this
// host's, including records not uploaded yet) and holds the bucket's gc
// lock, so no host uploads meanwhile; a pack is deleted only if no blob in
// it is live and it is older than the grace period. Packs with some live
// blobs are kept whole (their dead bytes are reported; repacking is future
// work).
func (e *Engine) GC(ctx context.Context, opts GCOptions) (*GCReport, error) {
	defer e.exclusive()()
	e.progressPhase("gc", 0)
	start := time.Now()
	grace := opts.Grace
	rep := &GCReport{DryRun: opts.DryRun}
	if e.remote != nil {
		lock, err := e.rem.Syncer().Lock(ctx, "gc")
		if err != nil {
			return nil, err
		}
		defer lock.Release(ctx)
		// Deleting under a lock that others may take for stale would
		// race their uploads: a lost lock cancels the gc.
		var cancel context.CancelFunc
		ctx, cancel = lock.Context(ctx)
		defer cancel()
		e.phase(PhaseGCLocked)
		// Records this home marked whose grace is over go first, under
		// the same lock, so that their packs are collected in this run.
		// A marked record not yet swept is still in records/ below, and
		// keeps its packs live.
		if !opts.DryRun {
			n, err := e.sweepForGC(ctx)
			rep.RecordsSwept = n
			if err != nil {
				return rep, fmt.Errorf("gc: sweep marked records: %w", err)
			}
		}
	}
	// Every pack's header: where each blob lives, on this host or not.
	type packInfo struct {
		info    upload.ObjectInfo
		entries []delta.PackEntry
	}
	packs := map[delta.ID]*packInfo{}
	locs := map[delta.ID]catalog.BlobLocation{}
	err := e.store.List(ctx, delta.PackPrefix, func(oi upload.ObjectInfo) error {
		id, ok := delta.ParsePackName(oi.Name)
		if !ok {
			return nil
		}
		entries, err := e.readPackHeader(ctx, oi.Name)
		if err != nil {
			return err
		}
		packs[id] = &packInfo{info: oi, entries: entries}
		for _, en := range entries {
			locs[en.ID] = content.LocationOf(id, en)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gc: packs: %w", err)
	}
	rep.Packs = len(packs)
	// Mark.
	live := map[delta.ID]bool{}
	w := &content.Walker{Loader: e.loaderFor(locs), Seen: live, Visit: func(delta.ID, delta.BlobType) error { return nil }}
	err = e.store.List(ctx, delta.RecordPrefix, func(oi upload.ObjectInfo) error {
		id, err := delta.ParseID(strings.TrimPrefix(oi.Name, delta.RecordPrefix))
		if err != nil {
			return nil
		}
		data, err := upload.ReadAllMax(ctx, e.store, oi.Name, delta.MaxRecordSize)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil // pruned since the listing: it protects nothing any more
		}
		if err != nil {
			return err
		}
		cp, err := delta.DecodeRecord(id, data)
		if err != nil {
			return fmt.Errorf("object %s: %w", oi.Name, err)
		}
		rep.Records++
		for _, root := range cp.Roots() {
			if err := w.Walk(ctx, root); err != nil {
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
	var doomed []deadPack
	var doomedEntries int
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
		doomed = append(doomed, deadPack{id, p.entries})
		doomedEntries += len(p.entries)
		if len(doomed) == gcBatch || doomedEntries >= gcBatchEntries {
			doomedEntries = 0
			if err := e.deletePacks(ctx, doomed); err != nil {
				return rep, err
			}
			doomed = doomed[:0]
		}
	}
	if err := e.deletePacks(ctx, doomed); err != nil {
		return rep, err
	}
	if !opts.DryRun {
		e.dropFrozen(ctx)
	}
	rep.DurationMillis = float64(time.Since(start).Microseconds()) / 1000
	return rep, nil
}

type deadPack struct {
	id      delta.ID
	entries []delta.PackEntry
}

// gcBatch and gcBatchEntries bound the packs, and their blob index
// entries, that one catalog transaction of gc forgets.
const (
	gcBatch        = 200
	gcBatchEntries = 20000
)

// deletePacks removes packs from the bucket first, then locally, then from
// the catalog's blob index (only entries that point at each pack: another
// copy of a blob may live elsewhere) and the upload queue, in one
// transaction and one scan of the queue for the batch.
func (e *Engine) deletePacks(ctx context.Context, packs []deadPack) error {
	if len(packs) == 0 {
		return nil
	}
	names := map[string]bool{}
	for _, p := range packs {
		name := delta.PackName(p.id)
		if e.remote != nil {
			if err := e.remote.Delete(ctx, name); err != nil {
				return fmt.Errorf("gc: delete %s: %w", name, err)
			}
		}
		if err := e.local.Delete(ctx, name); err != nil {
			return fmt.Errorf("gc: delete %s: %w", name, err)
		}
		names[name] = true
	}
	return e.cat.Update(ctx, func(tx *catalog.Tx) error {
		// A pruned checkpoint's packs may still be queued for upload.
		if _, err := tx.DequeueNames(names); err != nil {
			return err
		}
		for _, p := range packs {
			for _, en := range p.entries {
				loc, ok, err := tx.Blob(en.ID)
				if err != nil {
					return err
				}
				if ok && loc.Pack == p.id {
					if err := tx.DeleteBlob(en.ID); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
}
