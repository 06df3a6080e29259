package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
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

// Remote durability. The local store is the write-ahead stage: a checkpoint
// is locally durable when it commits, and its objects are queued (in the
// same catalog transaction) for the remote store. Push uploads the queue in
// dependency order (a record only after every pack it needs, a ref only
// after its record), so the bucket alone is always a consistent history: it
// never holds a record whose data is missing. A checkpoint is remotely
// durable once its record is uploaded.

// backfillSandbox attributes uploads that belong to no sandbox in
// particular (the history a home had before `init` gave it a remote).
const backfillSandbox = "_backfill"

// queueCommit queues a committed checkpoint's objects: its new packs, then
// its record (after those packs, the still-pending packs it reuses blobs
// from, and its parent's record if that is pending), then its sandbox
// description and head ref (after the record).
func (e *Engine) queueCommit(tx *catalog.Tx, cp *catalog.Checkpoint, newSandbox *catalog.Sandbox) error {
	if e.remote == nil {
		return nil
	}
	pending, err := pendingNames(tx)
	if err != nil {
		return err
	}
	var items []catalog.PendingUpload
	var after []string
	for _, w := range e.repo.written {
		items = append(items, catalog.PendingUpload{Sandbox: cp.Sandbox, Checkpoint: cp.ID, Name: w.Name, Size: w.Size})
		after = append(after, w.Name)
	}
	for pack := range e.repo.reused {
		if name := upload.PackName(pack); pending[name] {
			after = append(after, name)
		}
	}
	if !cp.Parent.IsZero() && pending[recordName(cp.Parent)] {
		after = append(after, recordName(cp.Parent))
	}
	slices.Sort(after)
	rec := recordName(cp.ID)
	items = append(items, catalog.PendingUpload{Sandbox: cp.Sandbox, Checkpoint: cp.ID, Name: rec, After: after})
	if newSandbox != nil {
		items = append(items, catalog.PendingUpload{Sandbox: cp.Sandbox, Checkpoint: cp.ID, Name: sandboxName(cp.Sandbox), After: []string{rec}})
	}
	items = append(items, catalog.PendingUpload{Sandbox: cp.Sandbox, Checkpoint: cp.ID, Name: refName(catalog.RefHead, cp.Sandbox), After: []string{rec}})
	return tx.EnqueueUploads(items)
}

// queueRef queues a ref object (and, for a new sandbox, its description)
// after the record it points at, if that record is itself still pending.
func (e *Engine) queueRef(tx *catalog.Tx, sandbox string, kind catalog.RefKind, name string, target delta.ID, newSandbox bool) error {
	if e.remote == nil {
		return nil
	}
	pending, err := pendingNames(tx)
	if err != nil {
		return err
	}
	var after []string
	if rec := recordName(target); pending[rec] {
		after = []string{rec}
	}
	var items []catalog.PendingUpload
	if newSandbox {
		items = append(items, catalog.PendingUpload{Sandbox: sandbox, Checkpoint: target, Name: sandboxName(sandbox), After: after})
	}
	items = append(items, catalog.PendingUpload{Sandbox: sandbox, Checkpoint: target, Name: refName(kind, name), After: after})
	return tx.EnqueueUploads(items)
}

// queueDelete queues remote deletions of mutable objects (a removed
// sandbox's description and head, a deleted tag).
func (e *Engine) queueDelete(tx *catalog.Tx, sandbox string, names ...string) error {
	if e.remote == nil {
		return nil
	}
	var items []catalog.PendingUpload
	for _, n := range names {
		items = append(items, catalog.PendingUpload{Sandbox: sandbox, Name: n, Delete: true})
	}
	return tx.EnqueueUploads(items)
}

func pendingNames(tx *catalog.Tx) (map[string]bool, error) {
	all, err := tx.PendingUploads("")
	if err != nil {
		return nil, err
	}
	m := make(map[string]bool, len(all))
	for _, p := range all {
		m[p.Name] = true
	}
	return m, nil
}

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
}

// PushReport says what a push did.
type PushReport struct {
	Uploaded int
	Bytes    int64
	Deleted  int
	Duration time.Duration
}

// ErrNoRemote is returned by remote operations on a home without a remote.
var errNoRemote = fmt.Errorf("this home has no remote store (run `turnsnap init --remote s3://BUCKET/PREFIX --endpoint HOST:PORT`): %w", errdefs.ErrPrecondition)

// Push uploads queued objects through the host-wide scheduler: fair shares
// between sandboxes, the configured bandwidth cap and concurrency, each
// object after the objects it depends on. An object leaves the queue only
// once its PUT succeeded. On error, what was uploaded stays done and the
// rest stays queued for the next push.
func (e *Engine) Push(ctx context.Context, opts PushOptions) (*PushReport, error) {
	start := time.Now()
	if e.remote == nil {
		return nil, errNoRemote
	}
	var all []catalog.PendingUpload
	if err := e.view(ctx, func(tx *catalog.Tx) (err error) { all, err = tx.PendingUploads(""); return err }); err != nil {
		return nil, err
	}
	todo := selectUploads(all, opts.Sandbox)
	rep := &PushReport{}
	if len(todo) == 0 {
		rep.Duration = time.Since(start)
		return rep, nil
	}
	lock, err := e.lockRemote(ctx, "push")
	if err != nil {
		return nil, err
	}
	defer lock.release(ctx)
	if todo, err = e.preflight(ctx, todo); err != nil {
		return nil, err
	}
	rc := e.config.Remote
	s, err := sched.New(sched.Config{Store: e.remote, Concurrency: cmpOr(rc.Concurrency, DefaultUploadConcurrency),
		BytesPerSec: rc.BandwidthBytes, Logger: e.log})
	if err != nil {
		return nil, err
	}
	stopProgress := e.watchScheduler(s, opts.Progress)
	defer stopProgress()
	tickets := map[string]*sched.Ticket{}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	var deletes []job
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
		// Sizes are read now, not when queued: refs and sandbox descriptions
		// are rewritten in place. Nothing else writes the store while this
		// process holds the home lock.
		info, err := e.local.Stat(ctx, name)
		if errors.Is(err, errdefs.ErrNotFound) && strings.HasPrefix(name, upload.PackPrefix) {
			// Collected since it was queued (its checkpoint was pruned before
			// upload). A record that still needed it would have kept it live,
			// and preflight checked every record of this push.
			if err := e.cat.Update(ctx, func(tx *catalog.Tx) error { return doneAll(tx, p.covers) }); err != nil {
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
			Open: func() (io.ReadCloser, error) { return e.local.Get(ctx, name) }})
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
			err := e.cat.Update(context.WithoutCancel(ctx), func(tx *catalog.Tx) error { return doneAll(tx, p.covers) })
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
	if len(errs) == 0 {
		for _, p := range deletes {
			if err := e.remote.Delete(ctx, p.Name); err != nil {
				errs = append(errs, fmt.Errorf("remote delete %s: %w", p.Name, err))
				break
			}
			if err := e.cat.Update(ctx, func(tx *catalog.Tx) error { return doneAll(tx, p.covers) }); err != nil {
				errs = append(errs, err)
				break
			}
			rep.Deleted++
		}
	}
	rep.Duration = time.Since(start)
	return rep, errors.Join(errs...)
}

// job is one remote operation: the newest queued entry for a name, plus
// the older entries for the same name it supersedes. Mutable objects (refs,
// sandbox descriptions) are read at upload time, so an older entry would
// upload the newest content under the older entry's dependencies, possibly
// naming a record the bucket does not have yet; only the newest may run.
type job struct {
	catalog.PendingUpload
	covers []catalog.PendingUpload
}

// selectUploads picks a sandbox's queued uploads (all, for "") plus,
// transitively, the queued uploads they must follow, in queue order, one job
// per name.
func selectUploads(all []catalog.PendingUpload, sandbox string) []job {
	slices.SortFunc(all, func(a, b catalog.PendingUpload) int { return cmp.Compare(a.Seq, b.Seq) })
	last := map[string]int{}
	for i, p := range all {
		last[p.Name] = i
	}
	want := map[string]bool{}
	var add func(name string)
	add = func(name string) {
		i, ok := last[name]
		if !ok || want[name] {
			return
		}
		want[name] = true
		for _, a := range all[i].After {
			add(a)
		}
	}
	for _, p := range all {
		if sandbox == "" || p.Sandbox == sandbox {
			add(p.Name)
		}
	}
	var out []job
	covers := map[string][]catalog.PendingUpload{}
	for i, p := range all {
		if !want[p.Name] {
			continue
		}
		covers[p.Name] = append(covers[p.Name], p)
		if last[p.Name] == i {
			out = append(out, job{PendingUpload: p, covers: covers[p.Name]})
		}
	}
	return out
}

// preflight makes sure every pack the records of this push need will be in
// the bucket when they land: packs queued in this push, packs the bucket
// has, and otherwise packs re-uploaded from the local store (another host's
// gc may have collected a pack this host still reuses). It runs under the
// push lock, so no gc can delete a pack between this check and the record.
func (e *Engine) preflight(ctx context.Context, todo []job) ([]job, error) {
	inPush := map[string]bool{}
	for _, j := range todo {
		if strings.HasPrefix(j.Name, upload.PackPrefix) {
			// Only a pack this host still has will really go up.
			if _, err := e.local.Stat(ctx, j.Name); err != nil {
				continue
			}
		}
		inPush[j.Name] = true
	}
	remote := map[string]bool{}
	err := e.remote.List(ctx, upload.PackPrefix, func(oi upload.ObjectInfo) error { remote[oi.Name] = true; return nil })
	if err != nil {
		return nil, fmt.Errorf("list remote packs: %w", err)
	}
	var extra []job
	w := &walker{loader: e.repo, seen: map[delta.ID]bool{}}
	for i, j := range todo {
		if j.Delete || !strings.HasPrefix(j.Name, recordPrefix) {
			continue
		}
		id, err := delta.ParseID(strings.TrimPrefix(j.Name, recordPrefix))
		if err != nil {
			return nil, err
		}
		data, err := upload.ReadAll(ctx, e.local, j.Name)
		if err != nil {
			return nil, err
		}
		cp, err := catalog.DecodeRecord(id, data)
		if err != nil {
			return nil, err
		}
		var missing []string
		w.visit = func(b delta.ID, _ delta.BlobType) error {
			var loc catalog.BlobLocation
			var ok bool
			err := e.view(ctx, func(tx *catalog.Tx) (err error) { loc, ok, err = tx.Blob(b); return err })
			if err != nil || !ok {
				return fmt.Errorf("checkpoint %s: blob %s has no known pack: %w", id.Short(), b.Short(), errdefs.ErrNotFound)
			}
			name := upload.PackName(loc.Pack)
			if !inPush[name] && !remote[name] {
				inPush[name] = true
				missing = append(missing, name)
			}
			return nil
		}
		for _, root := range cp.Roots() {
			if err := w.walk(ctx, root); err != nil {
				return nil, err
			}
		}
		for _, name := range missing {
			info, err := e.local.Stat(ctx, name)
			if err != nil {
				return nil, fmt.Errorf("checkpoint %s needs %s, which neither the bucket nor this host has: %w",
					id.Short(), name, errdefs.ErrCorrupt)
			}
			e.log.Warn("re-uploading a pack the bucket lost (collected by another host?)", "pack", name, "checkpoint", id.Short())
			extra = append(extra, job{PendingUpload: catalog.PendingUpload{Sandbox: j.Sandbox, Name: name, Size: info.Size}})
			todo[i].After = append(todo[i].After, name)
		}
	}
	return append(extra, todo...), nil
}

func (e *Engine) watchScheduler(s *sched.Scheduler, fn func(sched.Stats)) (stop func()) {
	if fn == nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(progressEvery)
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
	return func() { close(done) }
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

func doneAll(tx *catalog.Tx, ps []catalog.PendingUpload) error {
	for _, p := range ps {
		if err := tx.UploadDone(p); err != nil {
			return err
		}
	}
	return nil
}
