package content

import (
	"bytes"
	"context"
	"fmt"
	"slices"

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
	o.closeSnapshot() // the index transactions below read the catalog afresh
	o.mixSmall()
	// Data before trees: a tree is never stored before the blobs it names.
	for _, t := range []delta.BlobType{delta.BlobData, delta.BlobTree} {
		if err := o.flushPack(ctx, t); err != nil {
			return err
		}
	}
	if o.r.room != nil {
		if err := o.r.room(); err != nil {
			return err
		}
	}
	ids := make([]delta.ID, 0, len(o.flushed))
	for id := range o.flushed {
		ids = append(ids, id)
	}
	refs := map[delta.ID]int64{}
	for _, id := range extraRefs {
		refs[id]++
	}
	if len(ids) <= groupBlobs && o.childCount() <= groupRefs {
		if err := o.publishGrouped(ctx, ids, refs); err != nil {
			return err
		}
	} else if err := o.publishAlone(ctx, ids, refs); err != nil {
		return err
	}
	// Published: the catalog now locates these blobs, and a second publish in
	// the same session must not count the same references twice.
	o.flushed = map[delta.ID]catalog.BlobLocation{}
	o.children = map[delta.ID][]delta.ID{}
	return nil
}

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
// transaction, shared with the concurrent turns' (catalog.Group): a busy
// daemon's commits then cost one catalog fsync between them, not two each
// in a row.
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

// publishGrouped indexes ids and adds refs plus the children of the trees
// it is first to index, in one transaction of the repository's group.
func (o *Op) publishGrouped(ctx context.Context, ids []delta.ID, extra map[delta.ID]int64) error {
	var lostTo []delta.ID
	err := o.r.group.Update(ctx, o.r.cat, func(tx *catalog.Tx) error {
		// fn may run again (a conflict, or the group's transaction
		// failed): start afresh each time.
		won, lost, err := o.index(tx, ids)
		if err != nil {
			return err
		}
		lostTo = lost
		refs := make(map[delta.ID]int64, len(extra))
		for id, n := range extra {
			refs[id] += n
		}
		o.addChildren(refs, won)
		for _, id := range sortedIDs(refs) {
			if _, err := tx.AddRefCount(id, refs[id]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("index blobs and refcounts: %w", err)
	}
	o.indexed(lostTo)
	return nil
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
