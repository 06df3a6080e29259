// Package rebuild recreates a home's catalog from its object store alone
// (docs/FORMAT.md): the store is the truth, the catalog an index of it.
package rebuild

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

// rebuildMarker is written into a fully built replacement catalog; only a
// marked one may take the live catalog's place (see Finish).
const rebuildMarker = "REBUILD-COMPLETE"

// Dir is where a rebuild builds the replacement of the catalog in
// catalogDir.
func Dir(catalogDir string) string        { return catalogDir + ".new" }
func retiredDir(catalogDir string) string { return catalogDir + ".old" }

// RebuildCatalog recreates the catalog from the object store alone: blob
// locations from pack headers, checkpoints from records, sandboxes and refs
// from their objects, refcounts by walking every distinct tree once. It
// builds beside the live catalog and swaps directories at the end, so a
// crash midway leaves the old catalog in place.
//
// It restores what it can: an object it cannot use (damaged or hostile, a
// record whose trees or chunks are in no pack, a ref naming a checkpoint
// the store lacks) is left out with everything that needs it, and named in
// Report.Skipped; every whole sandbox and checkpoint is restored and
// the catalog is swapped as for a complete rebuild. Only a failure to read
// the store (or, with Options.Strict, any skip) fails it.
func (r *Rebuilder) RebuildCatalog(ctx context.Context) (*Report, error) {
	return r.RebuildCatalogWith(ctx, Options{})
}

// RebuildCatalogWith is RebuildCatalog with options.
func (r *Rebuilder) RebuildCatalogWith(ctx context.Context, opts Options) (*Report, error) {
	defer r.d.Exclusive()()
	r.d.Phase("rebuild")
	if err := r.d.RefuseIfEncrypted(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	rep := &Report{}
	rb := &run{r: r, opts: opts, rep: rep}
	rb.store, rb.local, rb.remote = r.d.Stores()
	dir := Dir(r.d.CatalogDir)
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	cat, err := catalog.Open(ctx, dir, r.d.CatalogOptions())
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
	if err := r.d.Catalog().Close(); err != nil {
		return nil, err
	}
	r.d.SetCatalog(nil)
	if err := Finish(r.d.CatalogDir); err != nil {
		return nil, err
	}
	live, err := catalog.Open(ctx, r.d.CatalogDir, r.d.CatalogOptions())
	if err != nil {
		return nil, err
	}
	r.d.SetCatalog(live)
	slices.SortFunc(rep.Skipped, func(a, b SkippedObject) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(rep.Corrupt, func(a, b CorruptObject) int { return strings.Compare(a.Name, b.Name) })
	rep.Duration = time.Since(start)
	return rep, nil
}

// Finish swaps a completed rebuilt catalog into catalogDir's place. It
// runs at every open too, so a crash between the two renames is finished
// next time.
func Finish(catalogDir string) error {
	if _, err := os.Stat(Dir(catalogDir) + "/" + rebuildMarker); err != nil {
		os.RemoveAll(Dir(catalogDir)) // an unfinished rebuild is just discarded
		return nil
	}
	os.RemoveAll(retiredDir(catalogDir))
	if err := os.Rename(catalogDir, retiredDir(catalogDir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("catalog swap: %w", err)
	}
	if err := os.Rename(Dir(catalogDir), catalogDir); err != nil {
		return fmt.Errorf("catalog swap: %w", err)
	}
	os.Remove(catalogDir + "/" + rebuildMarker)
	return os.RemoveAll(retiredDir(catalogDir))
}

// run is one rebuild's state: its options, its stores and what it found.
type run struct {
	r                    *Rebuilder
	store, local, remote upload.Store
	opts                 Options
	rep                  *Report
	// owners are the owner lines of the bucket's heads, by sandbox key
	// (docs/STORAGE.md, "Ownership and fencing").
	owners map[string]delta.Owner
}

// skip leaves an object out of the rebuild and reports it with its class,
// or with Strict is the rebuild's error, naming the object once.
func (rb *run) skip(name string, class SkipClass, sandbox string, err error) error {
	if _, base, _ := strings.Cut(name, "/"); !strings.Contains(err.Error(), base) {
		err = fmt.Errorf("object %s: %w", name, err)
	}
	if rb.opts.Strict {
		if !errors.Is(err, errdefs.ErrCorrupt) {
			err = fmt.Errorf("%w: %w", err, errdefs.ErrCorrupt)
		}
		return err
	}
	rb.r.d.Log.Warn("rebuild: skipping an object", "object", name, "class", class, "err", err)
	rb.rep.Skipped = append(rb.rep.Skipped, SkippedObject{Name: name, Class: class, Sandbox: sandbox, Error: err.Error()})
	if class == SkipCorrupt {
		rb.rep.Corrupt = append(rb.rep.Corrupt, CorruptObject{Name: name, Error: err.Error()})
	}
	return nil
}

// bad skips an object that does not decode or breaks a rule.
func (rb *run) bad(name string, err error) error {
	if !errors.Is(err, errdefs.ErrCorrupt) {
		err = fmt.Errorf("%w: %w", err, errdefs.ErrCorrupt)
	}
	return rb.skip(name, SkipCorrupt, "", err)
}

// readSmall reads a listed object of at most max bytes. An object over the
// limit is skipped as corrupt; one gone since the listing (a prune or gc
// on another home) is nothing to restore, and found is false.
func (rb *run) readSmall(ctx context.Context, name string, max int64) (data []byte, found bool, err error) {
	data, err = upload.ReadAllMax(ctx, rb.store, name, max)
	switch {
	case err == nil:
		return data, true, nil
	case errors.Is(err, errdefs.ErrNotFound):
		rb.r.d.Log.Info("rebuild: object gone since it was listed", "object", name)
		return nil, false, nil
	case errors.Is(err, errdefs.ErrCorrupt) && !errors.Is(err, errdefs.ErrKey):
		return nil, false, rb.bad(name, err)
	}
	return nil, false, err
}

func (rb *run) fill(ctx context.Context, cat *catalog.Catalog) error {
	x := &packIndex{locs: map[delta.ID]catalog.BlobLocation{}, mtime: map[delta.ID]time.Time{}, alts: map[delta.ID][]catalog.BlobLocation{}}
	err := rb.store.List(ctx, "packs/", func(oi upload.ObjectInfo) error {
		id, ok := delta.ParsePackName(oi.Name)
		if !ok {
			return nil // not ours; leave it
		}
		entries, err := rb.readPackHeader(ctx, oi.Name)
		if errors.Is(err, errdefs.ErrCorrupt) && !errors.Is(err, errdefs.ErrKey) {
			return rb.bad(oi.Name, err)
		}
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil // deleted by a gc since it was listed
		}
		if err != nil {
			return err
		}
		rb.rep.Packs++
		for _, en := range entries {
			x.add(en.ID, content.LocationOf(id, en), oi.ModTime)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("rebuild: packs: %w", err)
	}
	rb.rep.Blobs = len(x.locs)
	// A sandbox removed here whose removal has not reached the bucket yet
	// is still there remotely: the old catalog's queue says it is gone.
	deleting := rb.pendingDeletes(ctx)
	byKey, err := rb.descriptions(ctx, deleting)
	if err != nil {
		return err
	}
	cps, err := rb.records(ctx, byKey)
	if err != nil {
		return err
	}
	// Only whole checkpoints are indexed: everything a restore of each
	// needs is in some pack and decodes.
	loader := treeLoader{rb.r.d.Blobs(), x, rb.bad}
	whole := &check.Whole{Loader: loader, Has: func(id delta.ID) bool { _, ok := x.locs[id]; return ok }}
	indexed := map[delta.ID]*delta.Checkpoint{}
	notWhole := map[delta.ID]SkippedObject{}
	var good []*delta.Checkpoint
	for _, cp := range cps {
		err := whole.Checkpoint(ctx, cp)
		if err != nil && !check.Skippable(err) {
			return fmt.Errorf("rebuild: %w", err)
		}
		if err != nil {
			name, class := delta.RecordName(cp.ID), skipClassOf(err)
			if err := rb.skip(name, class, string(cp.Sandbox), err); err != nil {
				return err
			}
			notWhole[cp.ID] = SkippedObject{Class: class, Error: err.Error()}
			continue
		}
		good = append(good, cp)
		indexed[cp.ID] = cp
	}
	rb.rep.Checkpoints = len(good)
	refcounts, exact := whole.Counts()
	if !exact {
		// Trees that only a skipped checkpoint reached were counted.
		if refcounts, err = check.CountRefs(ctx, loader, good); err != nil {
			return fmt.Errorf("rebuild: refcounts: %w", err)
		}
	}
	if err := cat.PutBlobs(ctx, x.locs); err != nil {
		return err
	}
	if err := cat.AddRefCounts(ctx, refcounts); err != nil {
		return err
	}
	sbs, refs, err := rb.names(ctx, deleting, byKey, indexed, notWhole)
	if err != nil {
		return err
	}
	rb.rep.Sandboxes, rb.rep.Refs = len(sbs), len(refs)
	if err := rb.carryUploads(ctx, cat); err != nil {
		return err
	}
	for len(good) > 0 {
		n := min(len(good), rebuildBatch)
		err := cat.Update(ctx, func(tx *catalog.Tx) error {
			for _, cp := range good[:n] {
				if err := tx.PutCheckpoint(cp); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		good = good[n:]
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
			if err := tx.SetSandboxOwner(delta.SandboxKey(key), o); err != nil {
				return err
			}
		}
		return nil
	})
}

// records reads and decodes every record of the store. A record that does
// not decode, is not in the canonical encoding the catalog stores (so it
// could not be indexed under its name), or claims a sandbox whose base it
// does not share (every checkpoint of a sandbox is over the sandbox's base:
// rollback refuses any other) is skipped as corrupt.
func (rb *run) records(ctx context.Context, byKey map[string]*delta.Sandbox) ([]*delta.Checkpoint, error) {
	var cps []*delta.Checkpoint
	err := rb.store.List(ctx, delta.RecordPrefix, func(oi upload.ObjectInfo) error {
		id, err := delta.ParseID(strings.TrimPrefix(oi.Name, delta.RecordPrefix))
		if err != nil || delta.RecordName(id) != oi.Name {
			return nil // not ours; leave it
		}
		data, found, err := rb.readSmall(ctx, oi.Name, delta.MaxRecordSize)
		if !found {
			return err
		}
		cp, err := delta.DecodeRecord(id, data)
		if err != nil {
			return rb.bad(oi.Name, err)
		}
		if _, again, err := delta.EncodeRecord(cp); err != nil || again != id {
			return rb.bad(oi.Name, fmt.Errorf("checkpoint %s: record is not in its canonical encoding (%v)", id, err))
		}
		if sb, ok := byKey[string(cp.SandboxKey())]; ok && cp.BaseTree != sb.BaseTree {
			return rb.bad(oi.Name, fmt.Errorf("checkpoint %s claims sandbox %s (%s), but is over base %s, not the sandbox's %s",
				id, cp.SandboxKey(), sb.Name, cp.BaseTree.Short(), sb.BaseTree.Short()))
		}
		cps = append(cps, cp)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rebuild: records: %w", err)
	}
	return cps, nil
}

// pendingDeletes names the objects the old catalog's upload queue still has
// to delete remotely. An unreadable old catalog gives none: the bucket is
// then all there is to go by.
func (rb *run) pendingDeletes(ctx context.Context) map[string]bool {
	out := map[string]bool{}
	old := rb.r.d.Catalog()
	if old == nil || rb.remote == nil {
		return out
	}
	old.View(ctx, func(tx *catalog.Tx) error {
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
func (rb *run) readPackHeader(ctx context.Context, name string) ([]delta.PackEntry, error) {
	return ReadPackHeader(ctx, rb.r.d.Keys(), rb.local, rb.remote, name)
}

// ReadPackHeader reads a pack's header from the local store, or straight
// from the remote one (nil: none) when the local store lacks it: a range
// read, not a download of the whole pack.
func ReadPackHeader(ctx context.Context, keys *delta.Keys, local, remote upload.Store, name string) ([]delta.PackEntry, error) {
	entries, err := keys.ReadPackHeader(ctx, upload.Ranges(local), name)
	if errors.Is(err, errdefs.ErrNotFound) && remote != nil {
		return keys.ReadPackHeader(ctx, upload.Ranges(remote), name)
	}
	return entries, err
}

// carryUploads keeps the upload queue across a rebuild: the old catalog's
// queue if it is readable, plus anything local the bucket lacks (the only
// source left when the old catalog is gone).
func (rb *run) carryUploads(ctx context.Context, cat *catalog.Catalog) error {
	if rb.remote == nil {
		return nil
	}
	var old []catalog.PendingUpload
	if oc := rb.r.d.Catalog(); oc != nil {
		if err := oc.View(ctx, func(tx *catalog.Tx) (err error) { old, err = tx.PendingUploads(""); return err }); err != nil {
			rb.r.d.Log.Warn("rebuild: old upload queue unreadable", "err", err)
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
	s := rb.r.d.Syncer()
	s.Blobs = rb.r.d.BlobsOf(cat)
	if _, _, err := s.Backfill(ctx, cat); err != nil {
		if len(old) == 0 {
			return fmt.Errorf("rebuild: cannot tell what the remote store lacks: %w", err)
		}
		rb.r.d.Log.Warn("rebuild: remote not listed; kept the old upload queue", "err", err)
	}
	return nil
}
