package retention

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

// DefaultRecordGrace is how long a record prune or forget marks on a
// shared bucket waits before a later run may delete it (the CLI's and the
// daemon's default): far longer than any host takes between branching from
// a checkpoint and pushing the branch, as gc's grace is for packs.
const DefaultRecordGrace = time.Hour

// Retention on a home with a remote is two-phase (restic's prune and
// kopia's maintenance both leave a safety margin between deciding and
// deleting, for the same reason): another home sharing the bucket may
// branch from any checkpoint it can see, and this home learns of it only
// through the bucket's refs.
//
//   - What is live is computed from every ref in the bucket (every home's
//     heads, every tag, the origin of every sandbox description) as well
//     as this home's catalog, so a checkpoint another home names is kept.
//   - Mark: the records a run decides to delete are written, with a due
//     time (now + grace), to this home's mark object (delta.Marks) before
//     anything is deleted.
//   - Sweep: a run (prune, forget, policy apply, gc) takes the bucket's gc
//     lock, which no push holds meanwhile, re-reads every ref in the
//     bucket, and deletes the due records none names; a record a ref names
//     again is unmarked. So a ref written before the sweep protects its
//     record even with no grace, and a push after the sweep finds its
//     ref's target gone and uploads it again from its own store
//     (remote.Syncer's preflight) or fails naming it.
//
// Without a remote no other home can name a record: deletion is at once,
// as it always was, and no mark object exists.

// loadMarks reads this home's mark object; none is an empty one.
func (o *op) loadMarks(ctx context.Context) (*delta.Marks, error) {
	name := delta.MarkName(o.HomeID)
	data, err := upload.ReadAllMax(ctx, o.Remote, name, delta.MaxMarksObject)
	if errors.Is(err, errdefs.ErrNotFound) {
		return &delta.Marks{Version: 1, Home: o.HomeID}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("object %s: %w", name, err)
	}
	return delta.DecodeMarks(name, data)
}

// saveMarks writes this home's mark object, or removes it when empty.
func (o *op) saveMarks(ctx context.Context, m *delta.Marks) error {
	name := delta.MarkName(o.HomeID)
	if len(m.Records) == 0 {
		if err := o.Remote.Delete(ctx, name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("object %s: %w", name, err)
		}
		return nil
	}
	data, err := delta.EncodeMarks(m)
	if err != nil {
		return err
	}
	if err := upload.PutBytes(ctx, o.Remote, name, data); err != nil {
		return fmt.Errorf("object %s: %w", name, err)
	}
	return nil
}

// retired is what retire did with the records a run dropped.
type retired struct {
	deleted map[delta.ID]bool      // deleted now (this run's and earlier runs' due marks)
	marked  map[delta.ID]time.Time // left marked, deleted after this time
	swept   []*delta.Checkpoint    // deleted now that this run did not drop (marked by an earlier run)
}

// retire deletes, or marks for deletion, the records a run decided to drop
// (drop), for the sandboxes the run decided for (covered): at once without
// a remote; with one, through the mark object, sweeping what is due. h must
// hold the bucket's pins (addBucketPins). A dry run changes nothing and
// says what a real run would do with the dropped records.
func (o *op) retire(ctx context.Context, h *History, drop []*delta.Checkpoint, covered map[string]bool, grace time.Duration, dryRun bool) (*retired, error) {
	r := &retired{deleted: map[delta.ID]bool{}, marked: map[delta.ID]time.Time{}}
	now := time.Now().UTC()
	if o.Remote == nil {
		for _, cp := range drop {
			r.deleted[cp.ID] = true
		}
		if dryRun {
			return r, nil
		}
		return r, o.deleteInBatches(ctx, drop)
	}
	grace = max(grace, 0)
	m, err := o.loadMarks(ctx)
	if err != nil {
		return nil, err
	}
	orig := slices.Clone(m.Records)
	dropped := map[delta.ID]bool{}
	for _, cp := range drop {
		dropped[cp.ID] = true
	}
	// Unmark what this run keeps (a wider policy since) or what is pinned
	// now. What stays marked keeps its due time, or takes this run's if
	// that is sooner (--grace 0 means now).
	has := map[delta.ID]bool{}
	m.Records = slices.DeleteFunc(m.Records, func(mk delta.Mark) bool {
		if len(h.Pin[mk.ID]) > 0 || covered[mk.Sandbox] && !dropped[mk.ID] {
			return true
		}
		has[mk.ID] = true
		return false
	})
	for i, mk := range m.Records {
		if due := now.Add(grace); dropped[mk.ID] && due.Before(mk.Due) {
			if due.Before(mk.Marked) {
				due = mk.Marked // a clock that went back: keep the object valid
			}
			m.Records[i].Due = due
		}
	}
	for _, cp := range drop {
		if has[cp.ID] {
			continue
		}
		if len(m.Records) >= delta.MaxMarks {
			o.d.Log.Warn("mark object full: the rest of the checkpoints to delete wait for a later run",
				"checkpoint", cp.ID.Short(), "limit", delta.MaxMarks)
			break
		}
		m.Records = append(m.Records, delta.Mark{ID: cp.ID, Sandbox: string(cp.SandboxKey()), Marked: now, Due: now.Add(grace)})
	}
	for _, mk := range m.Records {
		r.marked[mk.ID] = mk.Due
	}
	for id := range r.marked {
		if !dropped[id] {
			delete(r.marked, id) // marked earlier for a sandbox this run did not decide for
		}
	}
	if dryRun {
		for id, due := range r.marked {
			if !due.After(now) {
				delete(r.marked, id)
				r.deleted[id] = true
			}
		}
		return r, nil
	}
	// The intent is in the bucket before anything is deleted.
	if !slices.Equal(orig, m.Records) {
		if err := o.saveMarks(ctx, m); err != nil {
			return nil, err
		}
	}
	if err := o.sweep(ctx, m, h.Pin, now, r); err != nil {
		return r, err
	}
	for id := range r.deleted {
		delete(r.marked, id)
	}
	r.swept = slices.DeleteFunc(r.swept, func(cp *delta.Checkpoint) bool { return dropped[cp.ID] })
	return r, nil
}

// sweep takes the bucket's gc lock and sweeps m's due records (sweepLocked).
// A bucket locked by another host's push leaves them marked for a later
// run: nothing is lost by waiting, and the run that marked them succeeds.
func (o *op) sweep(ctx context.Context, m *delta.Marks, local Pins, now time.Time, r *retired) error {
	if !slices.ContainsFunc(m.Records, func(mk delta.Mark) bool { return !mk.Due.After(now) }) {
		return nil
	}
	lock, err := o.d.LockBucket(ctx, "gc")
	if errors.Is(err, errdefs.ErrUnavailable) {
		o.d.Log.Info("bucket busy: marked checkpoints are deleted by a later prune, forget or gc", "err", err)
		return nil
	}
	if err != nil {
		return err
	}
	defer lock.Release(ctx)
	ctx, cancel := lock.Context(ctx)
	defer cancel()
	return o.sweepLocked(ctx, m, local, now, r)
}

// sweepLocked deletes m's records due at now that no ref names: it re-reads
// every ref in the bucket first, with the gc lock held (no push uploads a
// ref meanwhile), and unmarks a due record a ref (or local, this home's
// catalog's pins) names. m is saved with what is left.
func (o *op) sweepLocked(ctx context.Context, m *delta.Marks, local Pins, now time.Time, r *retired) error {
	fresh := Pins{}
	owners := map[string]delta.Owner{}
	if err := bucketRefs(ctx, o.Remote, fresh, owners); err != nil {
		return err
	}
	// A record of a sandbox another home has adopted since it was marked is
	// that home's to keep or drop now.
	adopted := map[delta.ID]bool{}
	if err := o.Catalog.View(ctx, func(tx *catalog.Tx) error {
		for _, mk := range m.Records {
			cp, err := tx.Checkpoint(mk.ID)
			if errors.Is(err, errdefs.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if ow, ok := owners[string(cp.SandboxKey())]; ok && ow.Home != o.HomeID {
				adopted[mk.ID] = true
			}
		}
		return nil
	}); err != nil {
		return err
	}
	var doomed []delta.ID
	changed := false
	m.Records = slices.DeleteFunc(m.Records, func(mk delta.Mark) bool {
		switch {
		case mk.Due.After(now):
			return false
		case adopted[mk.ID]:
			o.d.Log.Info("unmarking a checkpoint of a sandbox another home adopted", "checkpoint", mk.ID.Short())
			changed = true
			return true
		case len(fresh[mk.ID]) > 0 || len(local[mk.ID]) > 0:
			o.d.Log.Info("unmarking a checkpoint a ref names again", "checkpoint", mk.ID.Short(),
				"ref", strings.Join(append(fresh[mk.ID], local[mk.ID]...), ", "))
			changed = true
			return true
		}
		doomed = append(doomed, mk.ID)
		return false
	})
	if len(doomed) == 0 {
		if changed {
			return o.saveMarks(ctx, m)
		}
		return nil
	}
	var cps []*delta.Checkpoint
	var orphans []delta.ID // marked, but this catalog no longer indexes them
	err := o.Catalog.View(ctx, func(tx *catalog.Tx) error {
		for _, id := range doomed {
			cp, err := tx.Checkpoint(id)
			switch {
			case errors.Is(err, errdefs.ErrNotFound):
				orphans = append(orphans, id)
			case err != nil:
				return err
			default:
				cps = append(cps, cp)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, id := range orphans {
		name := delta.RecordName(id)
		for _, s := range []upload.Store{o.Remote, o.Local} {
			if err := s.Delete(ctx, name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				return fmt.Errorf("checkpoint %s: delete record: %w", id.Short(), err)
			}
		}
		r.deleted[id] = true
	}
	if err := o.deleteInBatches(ctx, cps); err != nil {
		return err
	}
	for _, cp := range cps {
		r.swept = append(r.swept, cp)
		r.deleted[cp.ID] = true
	}
	gone := map[delta.ID]bool{}
	for _, id := range doomed {
		gone[id] = true
	}
	m.Records = slices.DeleteFunc(m.Records, func(mk delta.Mark) bool { return gone[mk.ID] })
	return o.saveMarks(ctx, m)
}

// sweepForGC sweeps this home's due marks under the gc lock GC holds, so
// that the records it deletes no longer keep their packs live.
func (o *op) sweepForGC(ctx context.Context) (int, error) {
	m, err := o.loadMarks(ctx)
	if err != nil {
		return 0, err
	}
	now := time.Now().UTC()
	if !slices.ContainsFunc(m.Records, func(mk delta.Mark) bool { return !mk.Due.After(now) }) {
		return 0, nil
	}
	h, err := o.d.LoadHistory(ctx)
	if err != nil {
		return 0, err
	}
	r := &retired{deleted: map[delta.ID]bool{}, marked: map[delta.ID]time.Time{}}
	if err := o.sweepLocked(ctx, m, h.Pin, now, r); err != nil {
		return len(r.deleted), err
	}
	if len(r.deleted) > 0 {
		o.d.DropFrozen(ctx)
	}
	return len(r.deleted), nil
}

// deleteInBatches deletes cps, oldest first, pruneBatch at a time.
func (o *op) deleteInBatches(ctx context.Context, cps []*delta.Checkpoint) error {
	cps = slices.Clone(cps)
	slices.SortFunc(cps, func(a, b *delta.Checkpoint) int { return a.Created.Compare(b.Created) })
	for len(cps) > 0 {
		n := min(len(cps), pruneBatch)
		if err := o.deleteCheckpoints(ctx, cps[:n]); err != nil {
			return err
		}
		cps = cps[n:]
	}
	return nil
}
