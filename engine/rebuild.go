package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/check"
	"github.com/turnsnap/turnsnap/engine/content"
	"github.com/turnsnap/turnsnap/engine/remote"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// RebuildReport counts what a catalog rebuild found in the store.
type RebuildReport struct {
	Packs       int
	Blobs       int
	Checkpoints int
	Sandboxes   int
	Refs        int
	Duration    time.Duration
	// Corrupt lists the objects skipped as damaged (RebuildOptions.SkipCorrupt).
	Corrupt []CorruptObject
}

// RebuildOptions configures a catalog rebuild.
type RebuildOptions struct {
	// SkipCorrupt reports each damaged object (in RebuildReport.Corrupt)
	// and rebuilds from the rest; without it the first one fails the
	// rebuild, naming it (ErrCorrupt), and the old catalog stays.
	SkipCorrupt bool
}

// CorruptObject is an object a rebuild could not use.
type CorruptObject struct {
	Name  string `json:"name"`
	Error string `json:"error"`
}

// rebuildMarker is written into a fully built replacement catalog; only a
// marked one may take the live catalog's place (see finishRebuild).
const rebuildMarker = "REBUILD-COMPLETE"

func (h home) rebuildDir() string { return h.catalogDir() + ".new" }
func (h home) retiredDir() string { return h.catalogDir() + ".old" }

// RebuildCatalog recreates the catalog from the object store alone: blob
// locations from pack headers, checkpoints from records, sandboxes and refs
// from their objects, refcounts by walking every distinct tree once. It
// builds beside the live catalog and swaps directories at the end, so a
// crash midway leaves the old catalog in place.
func (e *Engine) RebuildCatalog(ctx context.Context) (*RebuildReport, error) {
	return e.RebuildCatalogWith(ctx, RebuildOptions{})
}

// RebuildCatalogWith is RebuildCatalog with options.
func (e *Engine) RebuildCatalogWith(ctx context.Context, opts RebuildOptions) (*RebuildReport, error) {
	defer e.exclusive()()
	e.progressPhase("rebuild", 0)
	if err := e.refuseIfEncrypted(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	rep := &RebuildReport{}
	rb := &rebuilder{e: e, opts: opts, rep: rep}
	dir := e.home.rebuildDir()
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	cat, err := catalog.Open(ctx, dir, e.catalogOptions(false))
	if err != nil {
		return nil, err
	}
	if err := rb.fill(ctx, cat); err != nil {
		cat.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	if err := cat.Close(); err != nil {
		return nil, err
	}
	if err := os.WriteFile(dir+"/"+rebuildMarker, nil, 0o600); err != nil {
		return nil, err
	}
	if err := e.cat.Close(); err != nil {
		return nil, err
	}
	e.cat = nil
	if err := finishRebuild(e.home); err != nil {
		return nil, err
	}
	if e.cat, err = catalog.Open(ctx, e.home.catalogDir(), e.catalogOptions(false)); err != nil {
		return nil, err
	}
	e.repo = e.newRepo()
	rep.Duration = time.Since(start)
	return rep, nil
}

// finishRebuild swaps a completed rebuilt catalog into place. It runs at
// every open too, so a crash between the two renames is finished next time.
func finishRebuild(h home) error {
	if _, err := os.Stat(h.rebuildDir() + "/" + rebuildMarker); err != nil {
		os.RemoveAll(h.rebuildDir()) // an unfinished rebuild is just discarded
		return nil
	}
	os.RemoveAll(h.retiredDir())
	if err := os.Rename(h.catalogDir(), h.retiredDir()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("catalog swap: %w", err)
	}
	if err := os.Rename(h.rebuildDir(), h.catalogDir()); err != nil {
		return fmt.Errorf("catalog swap: %w", err)
	}
	os.Remove(h.catalogDir() + "/" + rebuildMarker)
	return os.RemoveAll(h.retiredDir())
}

// rebuilder is one rebuild's state: its options and what it found.
type rebuilder struct {
	e    *Engine
	opts RebuildOptions
	rep  *RebuildReport
	// owners are the owner lines of the bucket's heads, by sandbox key
	// (docs/STORAGE.md, "Ownership and fencing").
	owners map[string]delta.Owner
}

// bad handles a damaged object: skipped and reported with SkipCorrupt,
// otherwise the rebuild's error, naming it once.
func (rb *rebuilder) bad(name string, err error) error {
	if !errors.Is(err, errdefs.ErrCorrupt) {
		err = fmt.Errorf("%w: %w", err, errdefs.ErrCorrupt)
	}
	if _, base, _ := strings.Cut(name, "/"); !strings.Contains(err.Error(), base) {
		err = fmt.Errorf("object %s: %w", name, err)
	}
	if !rb.opts.SkipCorrupt {
		return err
	}
	rb.e.log.Warn("rebuild: skipping a damaged object", "object", name, "err", err)
	rb.rep.Corrupt = append(rb.rep.Corrupt, CorruptObject{Name: name, Error: err.Error()})
	return nil
}

// rebuildBatch bounds the writes of one catalog transaction in a rebuild
// (Badger refuses a transaction past its size limit).
const rebuildBatch = 1000

func (rb *rebuilder) fill(ctx context.Context, cat *catalog.Catalog) error {
	e := rb.e
	blobs := map[delta.ID]catalog.BlobLocation{}
	err := e.store.List(ctx, "packs/", func(oi upload.ObjectInfo) error {
		id, ok := delta.ParsePackName(oi.Name)
		if !ok {
			return nil // not ours; leave it
		}
		entries, err := e.readPackHeader(ctx, oi.Name)
		if errors.Is(err, errdefs.ErrCorrupt) {
			return rb.bad(oi.Name, err)
		}
		if err != nil {
			return err
		}
		rb.rep.Packs++
		for _, en := range entries {
			blobs[en.ID] = content.LocationOf(id, en)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("rebuild: packs: %w", err)
	}
	rb.rep.Blobs = len(blobs)
	if err := cat.PutBlobs(ctx, blobs); err != nil {
		return err
	}
	var cps []*delta.Checkpoint
	err = e.store.List(ctx, delta.RecordPrefix, func(oi upload.ObjectInfo) error {
		id, err := delta.ParseID(strings.TrimPrefix(oi.Name, delta.RecordPrefix))
		if err != nil {
			return nil
		}
		data, err := upload.ReadAllMax(ctx, e.store, oi.Name, delta.MaxRecordSize)
		if err != nil {
			return err
		}
		cp, err := delta.DecodeRecord(id, data)
		if err != nil {
			return rb.bad(oi.Name, err)
		}
		cps = append(cps, cp)
		return nil
	})
	if err != nil {
		return fmt.Errorf("rebuild: records: %w", err)
	}
	rb.rep.Checkpoints = len(cps)
	refcounts, err := check.CountRefs(ctx, e.loaderFor(blobs), cps)
	if err != nil {
		return fmt.Errorf("rebuild: refcounts: %w", err)
	}
	if err := cat.AddRefCounts(ctx, refcounts); err != nil {
		return err
	}
	sbs, refs, err := rb.names(ctx)
	if err != nil {
		return err
	}
	rb.rep.Sandboxes, rb.rep.Refs = len(sbs), len(refs)
	if err := e.carryUploads(ctx, cat); err != nil {
		return err
	}
	for len(cps) > 0 {
		n := min(len(cps), rebuildBatch)
		err := cat.Update(ctx, func(tx *catalog.Tx) error {
			for _, cp := range cps[:n] {
				if err := tx.PutCheckpoint(cp); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		cps = cps[n:]
	}
	return cat.Update(ctx, func(tx *catalog.Tx) error {
		for _, sb := range sbs {
			if err := tx.PutSandbox(sb); err != nil {
				return err
			}
		}
		for _, r := range refs {
			if err := tx.SetRef(r); err != nil {
				return err
			}
		}
		for key, o := range rb.owners {
			if err := tx.SetSandboxOwner(key, o); err != nil {
				return err
			}
		}
		return nil
	})
}

// pendingDeletes names the objects the old catalog's upload queue still has
// to delete remotely. An unreadable old catalog gives none: the bucket is
// then all there is to go by.
func (e *Engine) pendingDeletes(ctx context.Context) map[string]bool {
	out := map[string]bool{}
	if e.cat == nil || e.remote == nil {
		return out
	}
	e.cat.View(ctx, func(tx *catalog.Tx) error {
		all, err := tx.PendingUploads("")
		for _, p := range all {
			if p.Delete {
				out[p.Name] = true
			}
		}
		return err
	})
	return out
}

// readPackHeader reads a pack's header from the local copy, or straight from
// the remote store (a range read, not a download of the whole pack).
func (e *Engine) readPackHeader(ctx context.Context, name string) ([]delta.PackEntry, error) {
	entries, err := e.localKeys().ReadPackHeader(ctx, upload.Ranges(e.local), name)
	if errors.Is(err, errdefs.ErrNotFound) && e.remote != nil {
		return e.localKeys().ReadPackHeader(ctx, upload.Ranges(e.remote), name)
	}
	return entries, err
}

// carryUploads keeps the upload queue across a rebuild: the old catalog's
// queue if it is readable, plus anything local the bucket lacks (the only
// source left when the old catalog is gone).
func (e *Engine) carryUploads(ctx context.Context, cat *catalog.Catalog) error {
	if e.remote == nil {
		return nil
	}
	var old []catalog.PendingUpload
	if e.cat != nil {
		if err := e.cat.View(ctx, func(tx *catalog.Tx) (err error) { old, err = tx.PendingUploads(""); return err }); err != nil {
			e.log.Warn("rebuild: old upload queue unreadable", "err", err)
		}
	}
	slices.SortFunc(old, func(a, b catalog.PendingUpload) int { return cmp.Compare(a.Seq, b.Seq) })
	for rest := old; len(rest) > 0; {
		n := min(len(rest), remote.BackfillBatch)
		if err := cat.Update(ctx, func(tx *catalog.Tx) error { return tx.EnqueueUploads(rest[:n]) }); err != nil {
			return err
		}
		rest = rest[n:]
	}
	// Trees are read through the new catalog's blob index: the old one may
	// be what was lost.
	s := e.syncer()
	s.Blobs = content.NewSealedIDs(e.store, cat, e.codec, e.meter, e.localKeys(), e.ids())
	if _, _, err := s.Backfill(ctx, cat); err != nil {
		if len(old) == 0 {
			return fmt.Errorf("rebuild: cannot tell what the remote store lacks: %w", err)
		}
		e.log.Warn("rebuild: remote not listed; kept the old upload queue", "err", err)
	}
	return nil
}

// loaderFor reads blobs using a location map instead of the catalog.
func (e *Engine) loaderFor(locs map[delta.ID]catalog.BlobLocation) delta.BlobLoader {
	return e.repo.LoaderFor(locs)
}
