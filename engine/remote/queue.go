package remote

import (
	"cmp"
	"slices"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/upload"
)

// Remote durability. The local store is the write-ahead stage: a checkpoint
// is locally durable when it commits, and its objects are queued (in the
// same catalog transaction) for the remote store. Push uploads the queue in
// dependency order (a record only after every pack it needs, a ref only
// after its record), so the bucket alone is always a consistent history: it
// never holds a record whose data is missing. A checkpoint is remotely
// durable once its record is uploaded.

// BackfillSandbox attributes uploads that belong to no sandbox in
// particular (the history a home had before `init` gave it a remote).
const BackfillSandbox = "_backfill"

// Written is what QueueCommit needs of a commit's content operation
// (content.Op): the packs it wrote, and the packs of others it reuses.
type Written interface {
	Written() []upload.ObjectInfo
	Reused() []delta.ID
}

// QueueCommit queues a committed checkpoint's objects: its new packs, then
// its record (after those packs, the still-pending packs it reuses blobs
// from, and its parent's record if that is pending), then its sandbox
// description and head ref (after the record).
func QueueCommit(tx *catalog.Tx, op Written, cp *delta.Checkpoint, newSandbox *delta.Sandbox) error {
	pending, err := PendingNames(tx)
	if err != nil {
		return err
	}
	var items []catalog.PendingUpload
	var after []string
	for _, w := range op.Written() {
		items = append(items, catalog.PendingUpload{Sandbox: string(cp.Sandbox), Checkpoint: cp.ID, Name: w.Name, Size: w.Size})
		after = append(after, w.Name)
	}
	for _, pack := range op.Reused() {
		if name := delta.PackName(pack); pending[name] {
			after = append(after, name)
		}
	}
	if !cp.Parent.IsZero() && pending[delta.RecordName(cp.Parent)] {
		after = append(after, delta.RecordName(cp.Parent))
	}
	slices.Sort(after)
	rec := delta.RecordName(cp.ID)
	items = append(items, catalog.PendingUpload{Sandbox: string(cp.Sandbox), Checkpoint: cp.ID, Name: rec, After: after})
	if newSandbox != nil {
		items = append(items, catalog.PendingUpload{Sandbox: string(cp.Sandbox), Checkpoint: cp.ID, Name: delta.SandboxObject(cp.SandboxKey()), After: []string{rec}})
	}
	items = append(items, catalog.PendingUpload{Sandbox: string(cp.Sandbox), Checkpoint: cp.ID, Name: delta.HeadObject(cp.SandboxKey()), After: []string{rec}})
	return tx.EnqueueUploads(items)
}

// QueueRef queues the ref object refObject (and, for a new sandbox, its
// description sandboxObject) after the record it points at, if that record
// is itself still pending. sandbox is the label the queue is accounted to.
func QueueRef(tx *catalog.Tx, sandbox, refObject string, target delta.ID, sandboxObject string) error {
	pending, err := PendingNames(tx)
	if err != nil {
		return err
	}
	var after []string
	if rec := delta.RecordName(target); pending[rec] {
		after = []string{rec}
	}
	var items []catalog.PendingUpload
	if sandboxObject != "" {
		items = append(items, catalog.PendingUpload{Sandbox: sandbox, Checkpoint: target, Name: sandboxObject, After: after})
	}
	items = append(items, catalog.PendingUpload{Sandbox: sandbox, Checkpoint: target, Name: refObject, After: after})
	return tx.EnqueueUploads(items)
}

// QueueDelete queues remote deletions of mutable objects (a removed
// sandbox's description and head, a deleted tag).
func QueueDelete(tx *catalog.Tx, sandbox string, names ...string) error {
	var items []catalog.PendingUpload
	for _, n := range names {
		items = append(items, catalog.PendingUpload{Sandbox: sandbox, Name: n, Delete: true})
	}
	return tx.EnqueueUploads(items)
}

// PendingNames is the set of names queued for upload.
func PendingNames(tx *catalog.Tx) (map[string]bool, error) {
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
	// checked is, for a ref, the record refTargets found in this push or
	// in the bucket, under the push lock.
	checked delta.ID
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

// DoneAll marks every entry of ps uploaded.
func DoneAll(tx *catalog.Tx, ps []catalog.PendingUpload) error {
	for _, p := range ps {
		if err := tx.UploadDone(p); err != nil {
			return err
		}
	}
	return nil
}
