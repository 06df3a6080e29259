package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
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

// bucketPins adds to pin every checkpoint a ref in the bucket names: every
// home's heads, every tag, and the origin of every sandbox description.
// A ref or description that cannot be read fails the call: retention that
// cannot see every ref deletes nothing. The objects are read
// bucketPinReaders at a time (a fleet's bucket holds one head and one
// description per sandbox, each a round trip).
func bucketPins(ctx context.Context, s upload.Store, pin pinned) error {
	return bucketRefs(ctx, s, pin, nil)
}

// bucketRefs is bucketPins that also gives, in owners (when not nil), the
// owner line of every head that has one, by sandbox key: a home whose
// sandbox another home adopted must stop pruning it even before it learns
// of the adoption by a fenced push.
func bucketRefs(ctx context.Context, s upload.Store, pin pinned, owners map[string]delta.Owner) error {
	var names []string
	for _, prefix := range []string{delta.HeadPrefix, delta.TagPrefix, delta.SandboxPrefix} {
		err := s.List(ctx, prefix, func(oi upload.ObjectInfo) error { names = append(names, oi.Name); return nil })
		if err != nil {
			return fmt.Errorf("list the bucket's %s: %w", prefix, err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	var firstErr error
	work := make(chan string)
	var wg sync.WaitGroup
	for range min(bucketPinReaders, len(names)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range work {
				id, why, owner, err := readPin(ctx, s, name)
				mu.Lock()
				switch {
				case err != nil && firstErr == nil:
					firstErr = err
					cancel()
				case err == nil && !id.IsZero():
					pin.add(id, why)
					if owners != nil && !owner.IsZero() {
						owners[strings.TrimPrefix(name, delta.HeadPrefix)] = owner
					}
				}
				mu.Unlock()
			}
		}()
	}
	for _, name := range names {
		if ctx.Err() != nil {
			break
		}
		work <- name
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return fmt.Errorf("read the bucket's refs: %w", firstErr)
	}
	return ctx.Err()
}

// bucketPinReaders bounds the ref reads of bucketPins in flight.
const bucketPinReaders = 8

// readPin reads one head, tag or sandbox description: the checkpoint it
// names (zero for none: a description made from a base, or an object
// removed since the listing) and why it pins it.
func readPin(ctx context.Context, s upload.Store, name string) (delta.ID, string, delta.Owner, error) {
	limit := int64(delta.MaxSmallObject)
	if strings.HasPrefix(name, delta.SandboxPrefix) {
		limit = delta.MaxSandboxObject
	}
	data, err := upload.ReadAllMax(ctx, s, name, limit)
	if errors.Is(err, errdefs.ErrNotFound) {
		return delta.ID{}, "", delta.Owner{}, nil // removed since the listing: it names nothing now
	}
	if err != nil {
		return delta.ID{}, "", delta.Owner{}, fmt.Errorf("object %s: %w", name, err)
	}
	if key, ok := strings.CutPrefix(name, delta.SandboxPrefix); ok {
		sb, err := delta.DecodeSandbox(name, data)
		if err != nil {
			return delta.ID{}, "", delta.Owner{}, err // names the object
		}
		return sb.Origin, "branched: " + sb.Name + " (" + key + ")", delta.Owner{}, nil
	}
	id, owner, err := delta.ParseHead(data)
	if err != nil {
		return delta.ID{}, "", delta.Owner{}, fmt.Errorf("object %s: %w", name, err)
	}
	if tag, ok := strings.CutPrefix(name, delta.TagPrefix); ok {
		return id, "tag " + tag, delta.Owner{}, nil
	}
	return id, "head in the bucket: " + strings.TrimPrefix(name, delta.HeadPrefix), owner, nil
}

// addBucketPins pins, in h, what the bucket's refs name and this catalog
// does not already pin (this home's own reasons read better).
func (e *Engine) addBucketPins(ctx context.Context, h *history) error {
	if e.remote == nil {
		return nil
	}
	b := pinned{}
	owners := map[string]delta.Owner{}
	if err := bucketRefs(ctx, e.remote, b, owners); err != nil {
		return err
	}
	for id, why := range b {
		if len(h.pin[id]) == 0 {
			h.pin[id] = why
		}
	}
	// The bucket's head says who owns a sandbox now: this home's catalog
	// may not know yet that another home adopted one of its sandboxes.
	for key, o := range owners {
		if o.Home != e.config.HomeID && h.owned[key] {
			h.owned[key] = false
		}
	}
	return nil
}

// loadMarks reads this home's mark object; none is an empty one.
func (e *Engine) loadMarks(ctx context.Context) (*delta.Marks, error) {
	name := delta.MarkName(e.config.HomeID)
	data, err := upload.ReadAllMax(ctx, e.remote, name, delta.MaxMarksObject)
	if errors.Is(err, errdefs.ErrNotFound) {
		return &delta.Marks{Version: 1, Home: e.config.HomeID}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("object %s: %w", name, err)
	}
	return delta.DecodeMarks(name, data)
}

// saveMarks writes this home's mark object, or removes it when empty.
func (e *Engine) saveMarks(ctx context.Context, m *delta.Marks) error {
	name := delta.MarkName(e.config.HomeID)
	if len(m.Records) == 0 {
		if err := e.remote.Delete(ctx, name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("object %s: %w", name, err)
		}
		return nil
	}
	data, err := delta.EncodeMarks(m)
	if err != nil {
		return err
	}
	if err := upload.PutBytes(ctx, e.remote, name, data); err != nil {
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
func (e *Engine) retire(ctx context.Context, h *history, drop []*delta.Checkpoint, covered map[string]bool, grace time.Duration, dryRun bool) (*retired, error) {
	r := &retired{deleted: map[delta.ID]bool{}, marked: map[delta.ID]time.Time{}}
	now := time.Now().UTC()
	if e.remote == nil {
		for _, cp := range drop {
			r.deleted[cp.ID] = true
		}
		if dryRun {
			return r, nil
		}
		return r, e.deleteInBatches(ctx, drop)
	}
	grace = max(grace, 0)
	m, err := e.loadMarks(ctx)
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
		if len(h.pin[mk.ID]) > 0 || covered[mk.Sandbox] && !dropped[mk.ID] {
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
			e.log.Warn("mark object full: the rest of the checkpoints to delete wait for a later run",
				"checkpoint", cp.ID.Short(), "limit", delta.MaxMarks)
			break
		}
		m.Records = append(m.Records, delta.Mark{ID: cp.ID, Sandbox: cp.SandboxKey(), Marked: now, Due: now.Add(grace)})
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
		if err := e.saveMarks(ctx, m); err != nil {
			return nil, err
		}
	}
	if err := e.sweep(ctx, m, h.pin, now, r); err != nil {
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
func (e *Engine) sweep(ctx context.Context, m *delta.Marks, local pinned, now time.Time, r *retired) error {
	if !slices.ContainsFunc(m.Records, func(mk delta.Mark) bool { return !mk.Due.After(now) }) {
		return nil
	}
	lock, err := e.rem.Syncer().Lock(ctx, "gc")
	if errors.Is(err, errdefs.ErrUnavailable) {
		e.log.Info("bucket busy: marked checkpoints are deleted by a later prune, forget or gc", "err", err)
		return nil
	}
	if err != nil {
		return err
	}
	defer lock.Release(ctx)
	ctx, cancel := lock.Context(ctx)
	defer cancel()
	return e.sweepLocked(ctx, m, local, now, r)
}

// sweepLocked deletes m's records due at now that no ref names: it re-reads
// every ref in the bucket first, with the gc lock held (no push uploads a
// ref meanwhile), and unmarks a due record a ref (or local, this home's
// catalog's pins) names. m is saved with what is left.
func (e *Engine) sweepLocked(ctx context.Context, m *delta.Marks, local pinned, now time.Time, r *retired) error {
	fresh := pinned{}
	owners := map[string]delta.Owner{}
	if err := bucketRefs(ctx, e.remote, fresh, owners); err != nil {
		return err
	}
	// A record of a sandbox another home has adopted since it was marked is
	// that home's to keep or drop now.
	adopted := map[delta.ID]bool{}
	if err := e.view(ctx, func(tx *catalog.Tx) error {
		for _, mk := range m.Records {
			cp, err := tx.Checkpoint(mk.ID)
			if errors.Is(err, errdefs.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if o, ok := owners[cp.SandboxKey()]; ok && o.Home != e.config.HomeID {
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
			e.log.Info("unmarking a checkpoint of a sandbox another home adopted", "checkpoint", mk.ID.Short())
			changed = true
			return true
		case len(fresh[mk.ID]) > 0 || len(local[mk.ID]) > 0:
			e.log.Info("unmarking a checkpoint a ref names again", "checkpoint", mk.ID.Short(),
				"ref", strings.Join(append(fresh[mk.ID], local[mk.ID]...), ", "))
			changed = true
			return true
		}
		doomed = append(doomed, mk.ID)
		return false
	})
	if len(doomed) == 0 {
		if changed {
			return e.saveMarks(ctx, m)
		}
		return nil
	}
	var cps []*delta.Checkpoint
	var orphans []delta.ID // marked, but this catalog no longer indexes them
	err := e.view(ctx, func(tx *catalog.Tx) error {
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
		for _, s := range []upload.Store{e.remote, e.local} {
			if err := s.Delete(ctx, name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				return fmt.Errorf("checkpoint %s: delete record: %w", id.Short(), err)
			}
		}
		r.deleted[id] = true
	}
	if err := e.deleteInBatches(ctx, cps); err != nil {
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
	return e.saveMarks(ctx, m)
}

// sweepForGC sweeps this home's due marks under the gc lock GC holds, so
// that the records it deletes no longer keep their packs live.
func (e *Engine) sweepForGC(ctx context.Context) (int, error) {
	m, err := e.loadMarks(ctx)
	if err != nil {
		return 0, err
	}
	now := time.Now().UTC()
	if !slices.ContainsFunc(m.Records, func(mk delta.Mark) bool { return !mk.Due.After(now) }) {
		return 0, nil
	}
	h, err := e.loadHistory(ctx)
	if err != nil {
		return 0, err
	}
	r := &retired{deleted: map[delta.ID]bool{}, marked: map[delta.ID]time.Time{}}
	if err := e.sweepLocked(ctx, m, h.pin, now, r); err != nil {
		return len(r.deleted), err
	}
	if len(r.deleted) > 0 {
		e.dropFrozen(ctx)
	}
	return len(r.deleted), nil
}

// deleteInBatches deletes cps, oldest first, pruneBatch at a time.
func (e *Engine) deleteInBatches(ctx context.Context, cps []*delta.Checkpoint) error {
	cps = slices.Clone(cps)
	slices.SortFunc(cps, func(a, b *delta.Checkpoint) int { return a.Created.Compare(b.Created) })
	for len(cps) > 0 {
		n := min(len(cps), pruneBatch)
		if err := e.deleteCheckpoints(ctx, cps[:n]); err != nil {
			return err
		}
		cps = cps[n:]
	}
	return nil
}
