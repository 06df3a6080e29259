// Package remote keeps a home's remote store in step with its local one:
// the upload queue (what each commit must send, in dependency order), the
// push that drains it through the scheduler, the bucket's lock objects that
// keep pushes and gc apart, and the backfill of a home's earlier history.
// It owns no turn logic; the engine queues in its commit transactions and
// calls Push.
package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
	"github.com/turnsnap/turnsnap/upload/sched"
)

// PushOptions configures Push.
type PushOptions struct {
	// Sandbox limits the push to one sandbox's queue (plus whatever of other
	// sandboxes' queues it depends on); empty pushes everything.
	Sandbox string
	// Urgent puts the uploads in the scheduler's urgent lane: someone waits.
	Urgent bool
	// Progress, if set, is called about every 200ms with the scheduler's
	// counters.
	Progress func(sched.Stats)
	// Yield, if set, is called before each upload starts (the daemon's
	// background rounds give way there to urgent checkpoints, which a
	// round that started before them would otherwise compete with to
	// its end).
	Yield func(context.Context)
}

// PushReport says what a push did.
type PushReport struct {
	Uploaded int
	Bytes    int64
	Deleted  int
	Duration time.Duration
}

// ErrNoRemote is returned by remote operations on a home without a remote.
var ErrNoRemote = fmt.Errorf("this home has no remote store (run `turnsnap init --remote s3://BUCKET/PREFIX --endpoint HOST:PORT`): %w", errdefs.ErrPrecondition)

// Syncer pushes one home's queued objects to its remote store. It is made
// per call from the engine's state and holds nothing between calls.
type Syncer struct {
	Local  upload.Store // where queued objects are read from
	Remote upload.Store // nil: the home has no remote
	Cat    *catalog.Catalog
	// Blobs reads trees, for preflight's walk of each pushed record.
	Blobs          delta.BlobLoader
	Concurrency    int   // uploads at once; 0 = DefaultConcurrency
	BandwidthBytes int64 // bytes/s cap; 0 = none
	// URL names the remote in errors.
	URL string
	// HomeID names this home in its lock objects.
	HomeID string
	// LockStaleAfter is the stale window this home's locks promise; 0 =
	// delta.DefaultLockStaleAfter.
	LockStaleAfter time.Duration
	Log            *slog.Logger
	// Done, if set, is told how every push that reached the scheduler
	// ended (the engine keeps the last one for status).
	Done func(*PushReport, error)
}

// DefaultConcurrency keeps a few PUTs in flight so one slow request does
// not idle the link, without letting a 2-core host spend itself on TLS.
const DefaultConcurrency = 4

// Push uploads queued objects through the host-wide scheduler: fair shares
// between sandboxes, the configured bandwidth cap and concurrency, each
// object after the objects it depends on. An object leaves the queue only
// once its PUT succeeded. On error, what was uploaded stays done and the
// rest stays queued for the next push.
func (e *Syncer) Push(ctx context.Context, opts PushOptions) (*PushReport, error) {
	start := time.Now()
	if e.Remote == nil {
		return nil, ErrNoRemote
	}
	var all []catalog.PendingUpload
	if err := e.Cat.View(ctx, func(tx *catalog.Tx) (err error) { all, err = tx.PendingUploads(""); return err }); err != nil {
		return nil, err
	}
	todo := selectUploads(all, opts.Sandbox)
	rep := &PushReport{}
	todo, err := e.dropVanished(ctx, todo)
	if err != nil {
		return nil, err
	}
	if len(todo) == 0 {
		rep.Duration = time.Since(start)
		return rep, nil
	}
	lock, err := e.Lock(ctx, "push")
	if err != nil {
		return nil, err
	}
	defer lock.Release(ctx)
	// Work under the lock's context: if the lock cannot be refreshed, other
	// hosts will soon take it for stale, so the push stops first.
	ctx, cancel := lock.Context(ctx)
	defer cancel()
	if todo, err = e.preflight(ctx, todo); err != nil {
		return nil, err
	}
	s, err := sched.New(sched.Config{Store: e.Remote, Concurrency: cmpOr(e.Concurrency, DefaultConcurrency),
		BytesPerSec: e.BandwidthBytes, Logger: e.Log})
	if err != nil {
		return nil, err
	}
	stopProgress := e.watchScheduler(s, opts.Progress)
	defer stopProgress()
	tickets := map[string]*sched.Ticket{}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	var deletes, heads []job
	headDeps := map[string][]*sched.Ticket{}
	for _, p := range todo {
		if p.Delete {
			deletes = append(deletes, p)
			continue
		}
		p := p
		var deps []*sched.Ticket
		for _, a := range p.After {
			if t, ok := tickets[a]; ok {
				deps = append(deps, t)
			}
		}
		name := p.Name
		if strings.HasPrefix(name, delta.HeadPrefix) {
			// Heads are written as their owner, conditionally, once
			// their records are up (heads.go).
			heads = append(heads, p)
			headDeps[name] = deps
			continue
		}
		// Sizes are read now, not when queued: refs and sandbox descriptions
		// are rewritten in place. Nothing else writes the store while this
		// process holds the home lock.
		info, err := e.Local.Stat(ctx, name)
		if errors.Is(err, errdefs.ErrNotFound) && strings.HasPrefix(name, delta.PackPrefix) {
			// Collected since it was queued (its checkpoint was pruned before
			// upload). A record that still needed it would have kept it live,
			// and preflight checked every record of this push.
			if err := e.Cat.Update(ctx, func(tx *catalog.Tx) error { return DoneAll(tx, p.covers) }); err != nil {
				errs = append(errs, err)
				break
			}
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("queued upload %s: %w", name, err))
			break
		}
		p.Size = info.Size
		t, err := s.Submit(ctx, sched.Upload{Sandbox: p.Sandbox, Name: name, Size: info.Size, Urgent: opts.Urgent, After: deps,
			Open: func() (io.ReadCloser, error) {
				if opts.Yield != nil {
					opts.Yield(ctx)
				}
				return e.Local.Get(ctx, name)
			}})
		if err != nil {
			errs = append(errs, err)
			break
		}
		tickets[name] = t
		wg.Add(1)
		go func(p job) {
			defer wg.Done()
			if err := t.Wait(ctx); err != nil {
				mu.Lock()
				errs = append(errs, err) // the scheduler's error names the object and sandbox
				mu.Unlock()
				return
			}
			// The PUT succeeded: only now does the object leave the queue.
			err := e.Cat.Update(context.WithoutCancel(ctx), func(tx *catalog.Tx) error { return DoneAll(tx, p.covers) })
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			rep.Uploaded++
			rep.Bytes += p.Size
		}(p)
	}
	wg.Wait()
	if err := s.Close(ctx); err != nil {
		errs = append(errs, err)
	}
	for _, p := range heads {
		if depsFailed(ctx, headDeps[p.Name]) {
			continue // its record's error is reported already
		}
		if opts.Yield != nil {
			opts.Yield(ctx)
		}
		if err := e.writeHead(ctx, p); errors.Is(err, errHeadAhead) {
			continue // the next push sends it, after its record
		} else if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := e.Cat.Update(context.WithoutCancel(ctx), func(tx *catalog.Tx) error { return DoneAll(tx, p.covers) }); err != nil {
			errs = append(errs, err)
			continue
		}
		rep.Uploaded++
	}
	if len(errs) == 0 {
		for _, p := range deletes {
			ok, err := e.mayDelete(ctx, p.Name)
			if err != nil {
				errs = append(errs, fmt.Errorf("remote delete %s: %w", p.Name, err))
				break
			}
			if !ok {
				// Another home's sandbox, dropped from this catalog only:
				// its objects in the bucket are its owner's.
				if err := e.Cat.Update(ctx, func(tx *catalog.Tx) error { return DoneAll(tx, p.covers) }); err != nil {
					errs = append(errs, err)
					break
				}
				continue
			}
			if err := e.Remote.Delete(ctx, p.Name); err != nil {
				errs = append(errs, fmt.Errorf("remote delete %s: %w", p.Name, err))
				break
			}
			if err := e.Cat.Update(ctx, func(tx *catalog.Tx) error { return DoneAll(tx, p.covers) }); err != nil {
				errs = append(errs, err)
				break
			}
			rep.Deleted++
		}
	}
	rep.Duration = time.Since(start)
	if e.Done != nil {
		e.Done(rep, errors.Join(errs...))
	}
	return rep, errors.Join(errs...)
}

// depsFailed reports whether any of ts failed (they have all ended).
func depsFailed(ctx context.Context, ts []*sched.Ticket) bool {
	for _, t := range ts {
		if t.Wait(ctx) != nil {
			return true
		}
	}
	return false
}

// dropVanished removes from the queue, and from todo, uploads of objects
// this host no longer has: a record pruned or a pack collected after it was
// queued, a ref or description removed since. None of them may block the
// queue: the bucket does not need them. A record the catalog still indexes
// is different: the local store lost a committed checkpoint, which is
// reported, not forgotten.
func (e *Syncer) dropVanished(ctx context.Context, todo []job) ([]job, error) {
	var gone []job
	out := todo[:0:0]
	for _, j := range todo {
		if j.Delete {
			out = append(out, j)
			continue
		}
		_, err := e.Local.Stat(ctx, j.Name)
		if err == nil {
			out = append(out, j)
			continue
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			return nil, fmt.Errorf("queued upload %s: %w", j.Name, err)
		}
		if id, ok := strings.CutPrefix(j.Name, delta.RecordPrefix); ok {
			if cid, perr := delta.ParseID(id); perr == nil {
				var indexed bool
				if err := e.Cat.View(ctx, func(tx *catalog.Tx) error {
					_, err := tx.Checkpoint(cid)
					indexed = err == nil
					return nil
				}); err != nil {
					return nil, err
				}
				if indexed {
					return nil, fmt.Errorf("checkpoint %s: its record is missing from the local store: %w", cid.Short(), errdefs.ErrCorrupt)
				}
			}
		}
		e.Log.Info("dropping a queued upload of an object removed since", "object", j.Name, "sandbox", j.Sandbox)
		gone = append(gone, j)
	}
	if len(gone) == 0 {
		return out, nil
	}
	err := e.Cat.Update(ctx, func(tx *catalog.Tx) error {
		for _, j := range gone {
			if err := DoneAll(tx, j.covers); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// preflight makes sure every pack the records of this push need will be in
// the bucket when they land: packs queued in this push, packs the bucket
// has, and otherwise packs re-uploaded from the local store (another host's
// gc may have collected a pack this host still reuses). It runs under the
// push lock, so no gc can delete a pack between this check and the record.
func (e *Syncer) preflight(ctx context.Context, todo []job) ([]job, error) {
	todo, err := e.refTargets(ctx, todo)
	if err != nil {
		return nil, err
	}
	inPush := map[string]bool{}
	for _, j := range todo {
		if strings.HasPrefix(j.Name, delta.PackPrefix) {
			// Only a pack this host still has will really go up.
			if _, err := e.Local.Stat(ctx, j.Name); err != nil {
				continue
			}
		}
		inPush[j.Name] = true
	}
	remote := map[string]bool{}
	err = e.Remote.List(ctx, delta.PackPrefix, func(oi upload.ObjectInfo) error { remote[oi.Name] = true; return nil })
	if err != nil {
		return nil, fmt.Errorf("list remote packs: %w", err)
	}
	var extra []job
	n := newNeeds(e.Cat, e.Blobs)
	for i, j := range todo {
		if j.Delete || !strings.HasPrefix(j.Name, delta.RecordPrefix) {
			continue
		}
		id, err := delta.ParseID(strings.TrimPrefix(j.Name, delta.RecordPrefix))
		if err != nil {
			return nil, err
		}
		data, err := upload.ReadAll(ctx, e.Local, j.Name)
		if err != nil {
			return nil, err
		}
		cp, err := delta.DecodeRecord(id, data)
		if err != nil {
			return nil, err
		}
		// The record waits for every pack of this push it needs, whatever
		// was queued with it: the queue's dependencies were computed when
		// the entry was made and may name objects since removed.
		after := map[string]bool{}
		for _, a := range todo[i].After {
			after[a] = true
		}
		var missing []string
		err = n.record(ctx, cp, func(name string) {
			switch {
			case inPush[name]:
				after[name] = true
			case !remote[name]:
				inPush[name] = true
				after[name] = true
				missing = append(missing, name)
			}
		}, func(other string) { after[other] = true })
		if err != nil {
			return nil, err
		}
		for _, name := range missing {
			info, err := e.Local.Stat(ctx, name)
			if err != nil {
				return nil, fmt.Errorf("checkpoint %s needs %s, which neither the bucket nor this host has: %w",
					id.Short(), name, errdefs.ErrCorrupt)
			}
			e.Log.Warn("re-uploading a pack the bucket lost (collected by another host?)", "pack", name, "checkpoint", id.Short())
			extra = append(extra, job{PendingUpload: catalog.PendingUpload{Sandbox: j.Sandbox, Name: name, Size: info.Size}})
		}
		todo[i].After = slices.Sorted(maps.Keys(after))
	}
	return append(extra, todo...), nil
}

func (e *Syncer) watchScheduler(s *sched.Scheduler, fn func(sched.Stats)) (stop func()) {
	if fn == nil {
		return func() {}
	}
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fn(s.Stats())
			}
		}
	}()
	// A last call once the ticker has stopped, so a caller that counts
	// sees the push's totals.
	return func() { close(done); <-exited; fn(s.Stats()) }
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}
