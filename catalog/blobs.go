package catalog

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// unmarshal decodes a catalog value strictly: an unknown field means a value
// written by something other than this schema version.
func unmarshal(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode: %v: %w", err, errdefs.ErrCorrupt)
	}
	return nil
}

// PutBlob records where blob id is stored, replacing any earlier location
// (a repack moves blobs).
func (tx *Tx) PutBlob(id delta.ID, loc BlobLocation) error {
	if err := checkBlob(id, &loc); err != nil {
		return err
	}
	return tx.setJSON(blobKey(id), &loc, "blob "+id.String())
}

func checkBlob(id delta.ID, loc *BlobLocation) error {
	if id.IsZero() {
		return fmt.Errorf("blob location: zero blob id: %w", errdefs.ErrInvalid)
	}
	if err := loc.validate(); err != nil {
		return fmt.Errorf("blob %s: location: %v: %w", id, err, errdefs.ErrInvalid)
	}
	return nil
}

// Blob returns where blob id is stored; found is false if the catalog does
// not know it (the caller may then look in the store's pack indexes).
func (tx *Tx) Blob(id delta.ID) (loc BlobLocation, found bool, err error) {
	found, err = tx.getJSON(blobKey(id), &loc, "blob "+id.String())
	return loc, found, err
}

// DeleteBlob forgets where a blob is stored, when the pack holding it is
// garbage collected. A missing entry is not an error.
func (tx *Tx) DeleteBlob(id delta.ID) error {
	if _, found, err := tx.get(blobKey(id)); err != nil || !found {
		return err
	}
	return tx.del(blobKey(id), "blob "+id.String())
}

// RefCount returns how many checkpoints reference object id; zero if none.
func (tx *Tx) RefCount(id delta.ID) (int64, error) {
	var n int64
	if _, err := tx.getJSON(refCountKey(id), &n, "refcount of "+id.String()); err != nil {
		return 0, err
	}
	return n, nil
}

// AddRefCount adds d to id's reference count and returns the new count. A
// result below zero is an error (ErrPrecondition) and changes nothing: it
// means a decrement without its increment, and clamping would hide the bug
// that frees a live object. A count reaching zero removes its key.
func (tx *Tx) AddRefCount(id delta.ID, d int64) (int64, error) {
	n, err := tx.RefCount(id)
	if err != nil {
		return 0, err
	}
	what := "refcount of " + id.String()
	sum := n + d
	if (d > 0 && sum < n) || (d < 0 && sum > n) {
		return n, fmt.Errorf("%s: count %d, adding %d overflows: %w", what, n, d, errdefs.ErrInvalid)
	}
	if sum < 0 {
		return n, fmt.Errorf("%s: count %d, adding %d would go below zero: %w", what, n, d, errdefs.ErrPrecondition)
	}
	if sum == 0 {
		return 0, tx.del(refCountKey(id), what)
	}
	return sum, tx.setJSON(refCountKey(id), sum, what)
}

// PutBlobs records many blob locations, as after a pack upload. It goes
// through a Badger WriteBatch, which splits any number of entries into
// transactions of the right size, so it is not atomic: after an error some
// locations may be recorded. That is harmless, since a location is only a
// hint of where an already-uploaded blob lives.
func (c *Catalog) PutBlobs(ctx context.Context, blobs map[delta.ID]BlobLocation) error {
	if err := c.ready(ctx); err != nil {
		return err
	}
	for id, loc := range blobs {
		if err := checkBlob(id, &loc); err != nil {
			return err
		}
	}
	wb := c.db.NewWriteBatch()
	flushing := false
	defer func() {
		// Cancel releases an unflushed batch; after Flush it would only
		// log Flush's error a second time.
		if !flushing {
			wb.Cancel()
		}
	}()
	i := 0
	for id, loc := range blobs {
		if i++; i%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("catalog %s: put blobs: %w", c.dir, err)
			}
		}
		data, err := json.Marshal(&loc)
		if err != nil {
			return fmt.Errorf("catalog %s: blob %s: encode: %w", c.dir, id, err)
		}
		key := blobKey(id)
		if err := wb.Set(key, data); err != nil {
			return fmt.Errorf("catalog %s: blob %s: %w", c.dir, id, err)
		}
		c.written.Add(int64(len(key) + len(data) + entryOverhead))
	}
	flushing = true
	if err := wb.Flush(); err != nil {
		return fmt.Errorf("catalog %s: put %d blobs: %w", c.dir, len(blobs), err)
	}
	return nil
}

// refCountChunk is how many counts one AddRefCounts transaction changes:
// far below Badger's per-transaction limit (about 25k small entries with our
// 16 MiB memtable), and large enough that 50k changes cost ~25 fsyncs.
const refCountChunk = 2000

// AddRefCounts applies many refcount changes, in chunks of separate
// transactions so any number fits. It is therefore not atomic, and callers
// order their work so that a partial apply or crash can only leak objects,
// never free one early: increments for a checkpoint's objects are applied
// before the transaction that adds the checkpoint, and decrements only after
// the transaction that deletes it. A count that would go below zero fails
// its chunk (ErrPrecondition); chunks before it stay applied.
func (c *Catalog) AddRefCounts(ctx context.Context, deltas map[delta.ID]int64) error {
	if err := c.ready(ctx); err != nil {
		return err
	}
	ids := make([]delta.ID, 0, len(deltas))
	for id, d := range deltas {
		if d != 0 {
			ids = append(ids, id)
		}
	}
	// A fixed order makes the chunking, and so which changes a failure
	// leaves unapplied, reproducible.
	slices.SortFunc(ids, func(a, b delta.ID) int { return bytes.Compare(a[:], b[:]) })
	for start := 0; start < len(ids); start += refCountChunk {
		chunk := ids[start:min(start+refCountChunk, len(ids))]
		err := c.Update(ctx, func(tx *Tx) error {
			for _, id := range chunk {
				if _, err := tx.AddRefCount(id, deltas[id]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("catalog %s: add refcounts (%d of %d applied): %w", c.dir, start, len(ids), err)
		}
	}
	return nil
}

// ForEachRefCount calls fn for every object with a non-zero reference
// count, in ID order: the checker compares them with a recount.
func (tx *Tx) ForEachRefCount(fn func(id delta.ID, n int64) error) error {
	return tx.scan([]byte{prefixRefCount}, true, func(key, val []byte) error {
		id, ok := idFromSuffix(key)
		if !ok {
			return fmt.Errorf("refcount key %x: %w", key, errdefs.ErrCorrupt)
		}
		var n int64
		if err := unmarshal(val, &n); err != nil {
			return fmt.Errorf("refcount of %s: %w", id, err)
		}
		return fn(id, n)
	})
}
