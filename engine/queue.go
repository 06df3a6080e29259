package engine

import (
	"cmp"
	"slices"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
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
func (e *Engine) queueCommit(tx *catalog.Tx, cp *delta.Checkpoint, newSandbox *delta.Sandbox) error {
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
		if name := delta.PackName(pack); pending[name] {
			after = append(after, name)
		}
	}
	if !cp.Parent.IsZero() && pending[delta.RecordName(cp.Parent)] {
		after = append(after, delta.RecordName(cp.Parent))
	}
	slices.Sort(after)
	rec := delta.RecordName(cp.ID)
	items = append(items, catalog.PendingUpload{Sandbox: cp.Sandbox, Checkpoint: cp.ID, Name: rec, After: after})
	if newSandbox != nil {
		items = append(items, catalog.PendingUpload{Sandbox: cp.Sandbox, Checkpoint: cp.ID, Name: delta.SandboxName(cp.Sandbox), After: []string{rec}})
	}
	items = append(items, catalog.PendingUpload{Sandbox: cp.Sandbox, Checkpoint: cp.ID, Name: delta.RefName(delta.RefHead, cp.Sandbox), After: []string{rec}})
	return tx.EnqueueUploads(items)
}

// queueRef queues a ref object (and, for a new sandbox, its description)
// after the record it points at, if that record is itself still pending.
func (e *Engine) queueRef(tx *catalog.Tx, sandbox string, kind delta.RefKind, name string, target delta.ID, newSandbox bool) error {
	if e.remote == nil {
		return nil
	}
	pending, err := pendingNames(tx)
	if err != nil {
		return err
	}
	var after []string
	if rec := delta.RecordName(target); pending[rec] {
		after = []string{rec}
	}
	var items []catalog.PendingUpload
	if newSandbox {
		items = append(items, catalog.PendingUpload{Sandbox: sandbox, Checkpoint: target, Name: delta.SandboxName(sandbox), After: after})
	}
	items = append(items, catalog.PendingUpload{Sandbox: sandbox, Checkpoint: target, Name: delta.RefName(kind, name), After: after})
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

func doneAll(tx *catalog.Tx, ps []catalog.PendingUpload) error {
	for _, p := range ps {
		if err := tx.UploadDone(p); err != nil {
			return err
		}
	}
	return nil
}
