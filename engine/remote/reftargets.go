package remote

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// refTargets makes sure the record every head and tag of this push names
// will be in the bucket when the ref lands: a record queued in this push,
// one the bucket has, or one re-uploaded from the local store. Another
// home's retention may have swept the record since this home saw it (this
// home branched from it and had not pushed the branch yet when the sweep
// re-read the bucket's refs); a ref naming a missing record would make the
// bucket unrestorable. A record neither the bucket nor this host has fails
// the push, naming it. Re-uploaded records are put first, so that the
// preflight's walk also restores the packs they need; like that walk it
// runs under the push lock, so no sweep or gc runs between the check and
// the ref's upload.
func (e *Syncer) refTargets(ctx context.Context, todo []job) ([]job, error) {
	inPush := map[string]bool{}
	for _, j := range todo {
		if !j.Delete {
			inPush[j.Name] = true
		}
	}
	checked := map[string]bool{}
	deferred := map[int]bool{}
	var extra []job
	for i, j := range todo {
		if j.Delete || !strings.HasPrefix(j.Name, delta.HeadPrefix) && !strings.HasPrefix(j.Name, delta.TagPrefix) {
			continue
		}
		data, err := upload.ReadAllMax(ctx, e.Local, j.Name, delta.MaxSmallObject)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // removed since it was queued; the upload loop drops it
		}
		if err != nil {
			return nil, fmt.Errorf("queued upload %s: %w", j.Name, err)
		}
		target, err := delta.ParseRef(data)
		if err != nil {
			return nil, fmt.Errorf("queued upload %s: %w", j.Name, err)
		}
		rec := delta.RecordName(target)
		if !inPush[rec] {
			// Refs are read at upload time: a commit in flight may have
			// moved this one to a record its catalog transaction has not
			// indexed yet. That commit queues the ref again; this push
			// leaves it for the next one.
			var indexed bool
			if err := e.Cat.View(ctx, func(tx *catalog.Tx) error {
				_, err := tx.Checkpoint(target)
				indexed = err == nil
				if errors.Is(err, errdefs.ErrNotFound) {
					err = nil
				}
				return err
			}); err != nil {
				return nil, err
			}
			if !indexed {
				deferred[i] = true
				continue
			}
		}
		todo[i].After = append(todo[i].After, rec) // a dependency on a name outside the push is ignored
		todo[i].checked = target
		if inPush[rec] || checked[rec] {
			continue
		}
		checked[rec] = true
		if _, err := e.Remote.Stat(ctx, rec); err == nil {
			continue
		} else if !errors.Is(err, errdefs.ErrNotFound) {
			return nil, fmt.Errorf("%s names checkpoint %s: %w", j.Name, target.Short(), err)
		}
		info, err := e.Local.Stat(ctx, rec)
		if err != nil {
			return nil, fmt.Errorf("%s names checkpoint %s, which neither the bucket nor this host has (deleted by another home's prune?): %w",
				j.Name, target.Short(), errdefs.ErrNotFound)
		}
		e.Log.Warn("re-uploading a checkpoint record the bucket lost (pruned by another home?)", "checkpoint", target.Short(), "ref", j.Name)
		inPush[rec] = true
		extra = append(extra, job{PendingUpload: catalog.PendingUpload{Sandbox: j.Sandbox, Name: rec, Size: info.Size}})
	}
	for i, j := range todo {
		if !deferred[i] {
			extra = append(extra, j)
		}
	}
	return extra, nil
}
