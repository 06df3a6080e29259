package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// packTarget is the size at which an open pack is written out. 16 MiB keeps
// a 5,000-small-file checkpoint to one or two objects and a large one to few
// PUTs, while one pack stays small enough to buffer in memory and to retry
// whole on a flaky link.
const packTarget = 16 << 20

// repo is the content store as delta sees it: blobs saved into packs in the
// object store, located through the catalog. One repo serves one write
// session (one checkpoint or import) at a time; commit publishes it.
type repo struct {
	store upload.Store
	cat   *catalog.Catalog
	codec *delta.Codec

	// One open pack per blob type: trees go in packs of their own, so walks
	// over trees (gc marking, rebuild refcounts, diff) read only small tree
	// packs and never pull data packs from a remote store.
	open    map[delta.BlobType]*upload.PackWriter
	flushed map[delta.ID]catalog.BlobLocation // in packs written this session, not yet in the catalog
	written []upload.ObjectInfo               // packs written this session, for the upload queue
	// unindexed are packs written this session that the catalog does not
	// index yet: a session that fails before indexing them deletes them
	// (reset), so a checkpoint that ran out of space leaves nothing behind.
	unindexed []string
	// room, if set, is asked before the catalog is written, after the packs
	// are (Engine.checkRoom).
	room   func() error
	reused map[delta.ID]bool  // packs of earlier sessions holding blobs this one reuses
	refs   map[delta.ID]int64 // refcount increments this session will commit
	stats  catalog.Stats
	buf    []byte
	packs  *packCache
	meter  *meter // nil: no progress reporting
}

func newRepo(store upload.Store, cat *catalog.Catalog, codec *delta.Codec) *repo {
	r := &repo{store: store, cat: cat, codec: codec, packs: newPackCache()}
	r.reset()
	return r
}

func (r *repo) reset() {
	for _, name := range r.unindexed {
		// Best effort: an unreferenced pack left behind is garbage gc
		// collects; only the space matters now.
		if err := r.store.Delete(context.Background(), name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			slog.Default().Warn("failed session: pack not removed", "pack", name, "err", err)
		}
	}
	r.unindexed = nil
	r.open = map[delta.BlobType]*upload.PackWriter{
		delta.BlobData: upload.NewPackWriter(), delta.BlobTree: upload.NewPackWriter(),
	}
	r.flushed = map[delta.ID]catalog.BlobLocation{}
	r.refs = map[delta.ID]int64{}
	r.stats = catalog.Stats{}
	r.written = nil
	r.reused = map[delta.ID]bool{}
}

// SaveBlob implements delta.BlobSaver: deduplicate against the catalog and
// this session, compress, append to the open pack.
func (r *repo) SaveBlob(ctx context.Context, t delta.BlobType, id delta.ID, plain []byte) (bool, error) {
	r.meter.add(len(plain))
	if _, ok := r.flushed[id]; ok || r.open[t].Has(id) {
		return false, nil
	}
	var known bool
	err := r.cat.View(ctx, func(tx *catalog.Tx) error {
		loc, ok, err := tx.Blob(id)
		if ok {
			// A checkpoint that reuses a blob must not reach the remote
			// store before the pack holding it does.
			r.reused[loc.Pack] = true
		}
		known = ok
		return err
	})
	if err != nil {
		return false, fmt.Errorf("blob %s: %w", id.Short(), err)
	}
	if known {
		return false, nil
	}
	if uint64(len(plain)) > delta.MaxRawLength(t) {
		return false, fmt.Errorf("%s blob %s: %d bytes, more than the format allows (%d; a directory with too many entries?): %w",
			t, id.Short(), len(plain), delta.MaxRawLength(t), errdefs.ErrInvalid)
	}
	if t == delta.BlobTree {
		// A new tree references its children once, whatever else does:
		// counting at tree creation keeps refcount upkeep O(change).
		tr, err := delta.DecodeTree(plain)
		if err != nil {
			return false, fmt.Errorf("tree %s: %w", id.Short(), err)
		}
		for _, e := range tr.Entries {
			switch e.Type {
			case delta.TypeDir:
				r.refs[e.Subtree]++
			case delta.TypeFile:
				for _, c := range e.Chunks {
					r.refs[c]++
				}
			}
		}
	}
	// PackWriter.Add copies, so one scratch buffer serves every blob. It must
	// never alias plain, which belongs to the caller (the chunker's buffer).
	stored, ok := r.codec.Compress(r.buf[:0], plain)
	r.buf = stored[:0]
	comp := upload.CompressionZstd
	if !ok {
		stored, comp = plain, upload.CompressionNone
	}
	r.open[t].Add(t, id, stored, len(plain), comp)
	r.stats.BlobsNew++
	if r.open[t].Len() >= packTarget {
		if err := r.flushPack(ctx, t); err != nil {
			return false, err
		}
	}
	return true, nil
}

// flushPack writes the open pack of blob type t to the store.
func (r *repo) flushPack(ctx context.Context, t delta.BlobType) error {
	if r.open[t].Count() == 0 {
		return nil
	}
	if t == delta.BlobTree {
		// The trees may name chunks still in the open data pack.
		if err := r.flushPack(ctx, delta.BlobData); err != nil {
			return err
		}
	}
	data, id, entries, err := r.open[t].Finish()
	if err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	name := upload.PackName(id)
	if err := upload.PutBytes(ctx, r.store, name, data); err != nil {
		return fmt.Errorf("write pack %s: %w", name, err)
	}
	for _, e := range entries {
		r.flushed[e.ID] = locationOf(id, e)
	}
	r.written = append(r.written, upload.ObjectInfo{Name: name, Size: int64(len(data))})
	r.unindexed = append(r.unindexed, name)
	r.stats.ObjectsNew++
	r.stats.BytesNew += int64(len(data))
	r.open[t] = upload.NewPackWriter()
	return nil
}

func locationOf(pack delta.ID, e upload.PackEntry) catalog.BlobLocation {
	return catalog.BlobLocation{
		Pack: pack, Type: e.Type, Offset: e.Offset, Length: e.Length,
		RawLength: e.RawLength, Compression: uint8(e.Compression),
	}
}

// publishBlobs makes every blob of this session durable and indexed: packs
// first, then the catalog's blob index and refcount increments. Both index
// writes are safe before the record exists: the blobs are really stored, and
// an increment without its checkpoint can only delay garbage collection.
func (r *repo) publishBlobs(ctx context.Context, extraRefs ...delta.ID) error {
	// Data before trees: a tree is never stored before the blobs it names.
	for _, t := range []delta.BlobType{delta.BlobData, delta.BlobTree} {
		if err := r.flushPack(ctx, t); err != nil {
			return err
		}
	}
	for _, id := range extraRefs {
		r.refs[id]++
	}
	if r.room != nil {
		if err := r.room(); err != nil {
			return err
		}
	}
	if err := r.cat.PutBlobs(ctx, r.flushed); err != nil {
		return fmt.Errorf("index blobs: %w", err)
	}
	r.unindexed = nil
	if err := r.cat.AddRefCounts(ctx, r.refs); err != nil {
		return fmt.Errorf("refcounts: %w", err)
	}
	// Published: the catalog now locates these blobs, and a second publish in
	// the same session must not count the same references twice.
	r.flushed = map[delta.ID]catalog.BlobLocation{}
	r.refs = map[delta.ID]int64{}
	return nil
}

// LoadBlob implements delta.BlobLoader: locate, read, decompress, verify.
func (r *repo) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	loc, ok := r.flushed[id]
	if !ok {
		err := r.cat.View(ctx, func(tx *catalog.Tx) error {
			var err error
			loc, ok, err = tx.Blob(id)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("blob %s: %w", id.Short(), err)
		}
	}
	if !ok {
		return nil, fmt.Errorf("blob %s (%s): not in any pack the catalog knows: %w", id, t, errdefs.ErrNotFound)
	}
	if loc.Type != t {
		return nil, fmt.Errorf("blob %s: stored as %s, wanted %s: %w", id, loc.Type, t, errdefs.ErrCorrupt)
	}
	name := upload.PackName(loc.Pack)
	// Bound what the index declares before it sizes any read or buffer: a
	// stored blob is never much larger than its plaintext.
	if most := delta.MaxRawLength(t); loc.RawLength > most || loc.Length > 2*most {
		return nil, fmt.Errorf("blob %s in %s: declares %d stored and %d plain bytes, over the %s limit %d: %w",
			id, name, loc.Length, loc.RawLength, t, most, errdefs.ErrCorrupt)
	}
	pack, ok := r.packs.get(loc.Pack)
	if !ok && r.packs.wantWhole(loc.Pack) {
		data, err := upload.ReadAllMax(ctx, r.store, name, upload.MaxPackSize)
		if err != nil {
			return nil, fmt.Errorf("blob %s in %s: %w", id.Short(), name, err)
		}
		r.packs.put(loc.Pack, data)
		pack, ok = data, true
	}
	if ok {
		end := loc.Offset + loc.Length
		if end < loc.Offset || end > uint64(len(pack)) {
			return nil, fmt.Errorf("blob %s in %s: range %d+%d beyond the pack's %d bytes: %w",
				id, name, loc.Offset, loc.Length, len(pack), errdefs.ErrCorrupt)
		}
		return r.decode(id, name, loc, pack[loc.Offset:end])
	}
	rc, err := upload.GetRange(ctx, r.store, name, int64(loc.Offset), int64(loc.Length))
	if err != nil {
		return nil, fmt.Errorf("blob %s in %s: %w", id.Short(), name, err)
	}
	stored, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return nil, fmt.Errorf("blob %s in %s: %w", id.Short(), name, err)
	}
	return r.decode(id, name, loc, stored)
}

// decode turns a blob's stored bytes back into verified plaintext.
func (r *repo) decode(id delta.ID, object string, loc catalog.BlobLocation, stored []byte) ([]byte, error) {
	if uint64(len(stored)) != loc.Length {
		return nil, fmt.Errorf("blob %s in %s: read %d bytes, want %d: %w", id, object, len(stored), loc.Length, errdefs.ErrCorrupt)
	}
	comp := upload.Compression(loc.Compression)
	if comp != upload.CompressionNone && comp != upload.CompressionZstd {
		return nil, fmt.Errorf("blob %s in %s: unknown compression %d: %w", id, object, loc.Compression, errdefs.ErrCorrupt)
	}
	plain, err := r.codec.DecodeBlob(loc.Type, id, comp == upload.CompressionZstd, loc.RawLength, stored)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, object)
	}
	r.meter.add(len(plain))
	return plain, nil
}
