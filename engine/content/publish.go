package content

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
)

// publishChunk is how many blobs one publish transaction indexes: far below
// Badger's per-transaction limit, large enough that a big checkpoint costs
// few fsyncs.
const publishChunk = 2000

// Publish makes every blob of this Op durable and indexed: packs first,
// then the catalog's blob index and refcount increments, with one more
// reference for each of extraRefs (a record's roots). Both index writes are
// safe before the record exists: the blobs are really stored, and an
// increment without its checkpoint can only delay garbage collection.
//
// Concurrent Ops may both find a blob new and both store it. Dedup is
// settled here, in the catalog transaction that indexes the blob: the
// first Op to index it wins; a later one keeps the winner's location,
// leaves its own copy as garbage for gc, and, for a tree, does not count
// the tree's children again (the winner counted them). So the catalog ends
// with one location per blob and refcounts equal to a rebuild's. Within
// one process the index writes are serialised (indexMu; a small Op's go in
// a group transaction run under it, in order, so the rule holds between
// the Ops of one group too), so they never conflict; between processes
// the home's flock serialises whole commands.
func (o *Op) Publish(ctx context.Context, extraRefs ...delta.ID) error {
	s, err := o.Stage(ctx, extraRefs...)
	if err != nil {
		return err
	}
	if s.pending {
		if err := o.r.group.Update(ctx, o.r.cat, s.Index); err != nil {
			return fmt.Errorf("index blobs and refcounts: %w", err)
		}
	}
	s.Done()
	return nil
}

// Staged is an Op whose packs are stored and whose blob index and
// refcount increments wait for a catalog transaction of the caller's
// (Index): a checkpoint's commit indexes a small turn's blobs in the
// transaction that adds the checkpoint, one fsync instead of two. The
// store holds the packs before the record that names them, which is all
// the write order needs (docs/FORMAT.md): gc marks from records, and a
// rebuild indexes packs from their headers.
type Staged struct {
	o       *Op
	pending bool // Index has work (a large Op was indexed by Stage)
	ids     []delta.ID
	extra   map[delta.ID]int64
	lost    []delta.ID
}

// Stage writes the Op's open packs (data before trees: a tree is never
// stored before the blobs it names) and checks the catalog's room. An Op
// too large for one transaction is indexed here, in transactions of its
// own, as Publish does; a small one's index is left to Staged.Index, with
// one more reference for each of extraRefs (a record's roots).
func (o *Op) Stage(ctx context.Context, extraRefs ...delta.ID) (*Staged, error) {
	o.closeSnapshot() // the index transactions read the catalog afresh
	o.mixSmall()
	for _, t := range []delta.BlobType{delta.BlobData, delta.BlobTree} {
		if err := o.flushPack(ctx, t); err != nil {
			return nil, err
		}
	}
	if o.r.room != nil {
		if err := o.r.room(0, o.packBytes()); err != nil {
			return nil, err
		}
	}
	ids := make([]delta.ID, 0, len(o.flushed))
	for id := range o.flushed {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b delta.ID) int { return bytes.Compare(a[:], b[:]) })
	refs := map[delta.ID]int64{}
	for _, id := range extraRefs {
		refs[id]++
	}
	s := &Staged{o: o}
	if len(ids) <= groupBlobs && o.childCount() <= groupRefs {
		s.pending, s.ids, s.extra = true, ids, refs
		return s, nil
	}
	if err := o.publishAlone(ctx, ids, refs); err != nil {
		return nil, err
	}
	return s, nil
}

// Index puts the staged blobs in tx's index unless a concurrent Op got
// there first (the dedup rule), and adds the refcounts: extraRefs, and the
// children of the trees this Op indexed. The caller holds the
// repository's IndexLock while tx runs. Index may run again in a fresh
// transaction (catalog.Group): it starts afresh each time.
func (s *Staged) Index(tx *catalog.Tx) error {
	if !s.pending {
		return nil
	}
	o := s.o
	won, lost, err := o.index(tx, s.ids)
	if err != nil {
		return err
	}
	s.lost = lost
	refs := make(map[delta.ID]int64, len(s.extra))
	for id, n := range s.extra {
		refs[id] += n
	}
	o.addChildren(refs, won)
	for _, id := range sortedIDs(refs) {
		if _, err := tx.AddRefCount(id, refs[id]); err != nil {
			return err
		}
	}
	// The same transaction may queue the checkpoint's uploads, which must
	// follow the packs of the blobs another Op indexed first (Reused).
	for _, p := range lost {
		o.reused[p] = true
	}
	return nil
}

// Done records that the transaction that ran Index committed: the catalog
// locates the Op's blobs now, and a second publish in the same session
// must not count the same references again.
func (s *Staged) Done() {
	o := s.o
	if s.pending {
		o.indexed(s.lost)
	}
	o.flushed = map[delta.ID]catalog.BlobLocation{}
	o.children = map[delta.ID][]delta.ID{}
}

// Keep makes Discard leave the Op's packs alone: a record that names them
// is being written (an index transaction that never commits must not take
// its packs with it).
func (o *Op) Keep() { o.unindexed = nil }

// IndexLock is the lock the writers of the blob index hold (see Staged).
func (r *Repo) IndexLock() *sync.Mutex { return &r.indexMu }

// mixedPackMax is the most an op's last data and tree packs may hold
// together to be written as one. Trees and chunks go in separate packs so
// that a walk of trees (gc, rebuild, diff) reads only tree packs
// (docs/FORMAT.md, "Pack"); a walk reads at most this much more for a
// mixed one, and a small turn (most turns) stores one object fewer: a
// local object is a create, two fsyncs and a rename, the largest part of
// such a turn's commit.
const mixedPackMax = 1 << 20

// mixSmall moves the open tree pack into the open data pack when both
// hold blobs and fit mixedPackMax together, trees after the chunks they
// may name.
func (o *Op) mixSmall() {
	data, trees := o.open[delta.BlobData], o.open[delta.BlobTree]
	if data.Count() == 0 || trees.Count() == 0 || data.Len()+trees.Len() > mixedPackMax {
		return
	}
	data.Absorb(trees) // refused only when a blob is in both: two packs then
}

// A turn that stored at most groupBlobs blobs whose new trees name at most
// groupRefs children indexes them and counts its references in one
// transaction (Staged.Index): its checkpoint's commit transaction, shared
// with the concurrent turns' (catalog.Group), so a busy daemon's commits
// cost one catalog fsync between them.
const (
	groupBlobs = 256
	groupRefs  = 1024
)

func (o *Op) childCount() int {
	n := 0
	for _, c := range o.children {
		n += len(c)
	}
	return n
}

// publishAlone is Publish for a large Op: the index in transactions of
// publishChunk blobs, then the refcounts (catalog.AddRefCounts, in
// chunks), each serialised with the other writers of the index.
func (o *Op) publishAlone(ctx context.Context, ids []delta.ID, refs map[delta.ID]int64) error {
	for start := 0; start < len(ids); start += publishChunk {
		chunk := ids[start:min(start+publishChunk, len(ids))]
		var won, lostTo []delta.ID
		o.r.indexMu.Lock()
		err := o.r.cat.Update(ctx, func(tx *catalog.Tx) (err error) {
			// fn may run again after a conflict: start afresh each time.
			won, lostTo, err = o.index(tx, chunk)
			return err
		})
		o.r.indexMu.Unlock()
		if err != nil {
			return fmt.Errorf("index blobs: %w", err)
		}
		o.indexed(lostTo)
		o.addChildren(refs, won)
	}
	o.r.indexMu.Lock()
	err := o.r.cat.AddRefCounts(ctx, refs)
	o.r.indexMu.Unlock()
	if err != nil {
		return fmt.Errorf("refcounts: %w", err)
	}
	return nil
}

// index puts each of ids in tx's blob index unless a concurrent op got
// there first (the dedup rule: the first to publish wins). won are the ones
// this op indexed; lostTo the packs of the winners.
func (o *Op) index(tx *catalog.Tx, ids []delta.ID) (won, lostTo []delta.ID, err error) {
	for _, id := range ids {
		loc, ok, err := tx.Blob(id)
		if err != nil {
			return nil, nil, err
		}
		if ok && !treeOverChunk(o.flushed[id].Type, loc) {
			lostTo = append(lostTo, loc.Pack)
			continue
		}
		if err := tx.PutBlob(id, o.flushed[id]); err != nil {
			return nil, nil, err
		}
		won = append(won, id)
	}
	return won, lostTo, nil
}

// addChildren counts a reference to each child of the trees in won: only
// the op that indexed a tree counts its children.
func (o *Op) addChildren(refs map[delta.ID]int64, won []delta.ID) {
	for _, id := range won {
		for _, c := range o.children[id] {
			refs[c]++
		}
	}
}

// indexed notes a committed index transaction: its packs hold indexed
// blobs now (never discarded), and the packs of blobs another op indexed
// first are reused.
func (o *Op) indexed(lostTo []delta.ID) {
	o.unindexed = nil
	o.r.dups.Add(int64(len(lostTo)))
	for _, p := range lostTo {
		o.reused[p] = true
	}
}

func sortedIDs(m map[delta.ID]int64) []delta.ID {
	out := make([]delta.ID, 0, len(m))
	for id, n := range m {
		if n != 0 {
			out = append(out, id)
		}
	}
	slices.SortFunc(out, func(a, b delta.ID) int { return bytes.Compare(a[:], b[:]) })
	return out
}
