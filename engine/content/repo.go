// Package content is the content repository: blobs deduplicated against
// the catalog, compressed and written into packs, located, read back and
// verified, and reference-counted. It owns no turn logic; the engine runs
// one Op per operation.
package content

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

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

// reserveAfter is the pack size past which a pack's buffer is sized to the
// whole target at once.
const reserveAfter = 1 << 20

// Repo is the content repository as delta sees it: blobs saved into packs
// in the object store, located through the catalog. A Repo is safe for
// concurrent use. It loads blobs itself (a delta.BlobLoader for restores,
// branches, walks); writes go through an Op, one per operation, which
// carries that operation's pending writes until Publish.
type Repo struct {
	store upload.Store
	cat   *catalog.Catalog
	codec *delta.Codec
	packs *packCache
	meter *Meter      // nil: no progress reporting
	keys  *delta.Keys // nil: a plaintext store
	ids   delta.IDs   // the content ID scheme every blob is checked under
	dups  atomic.Int64
	// indexMu serialises this process's writes of the blob index and
	// refcounts (Publish): the same hot keys (a shared base's trees, common
	// chunks) would otherwise make concurrent transactions conflict and
	// retry. The transactions it guards are short, one chunk each.
	indexMu sync.Mutex
	// group shares one catalog transaction between concurrent small
	// Publishes (Staged.Index); it runs them under indexMu.
	group catalog.Group
	// room, if set, is asked before each pack is written and before the
	// catalog is (SetRoomCheck).
	room func(need, packs uint64) error
}

// SetRoomCheck makes an Op call room before writing each pack (need: its
// bytes) and before writing the catalog (need 0), with the bytes its packs
// already take (packs: what a failed Op gives back); an error stops the Op
// there, and Discard then removes its packs (the engine's "home filesystem
// is full" check).
func (r *Repo) SetRoomCheck(room func(need, packs uint64) error) { r.room = room }

// packBytes is the size of the packs the Op has written.
func (o *Op) packBytes() uint64 {
	var n uint64
	for _, w := range o.written {
		n += uint64(w.Size)
	}
	return n
}

// Duplicates is how many blobs Ops of this Repo stored that another Op had
// indexed first (see Publish); their copies are garbage for gc.
func (r *Repo) Duplicates() int64 { return r.dups.Load() }

// Op is one write session (a checkpoint, an import, a process image): the
// blobs it saved, the packs it wrote and the references it will count. It
// is used by one goroutine; different Ops of one Repo run concurrently.
type Op struct {
	r *Repo
	// One open pack per blob type: trees go in packs of their own, so walks
	// over trees (gc marking, rebuild refcounts, diff) read only small tree
	// packs and never pull data packs from a remote store.
	open    map[delta.BlobType]*delta.PackWriter
	flushed map[delta.ID]catalog.BlobLocation // in packs written by this Op, not yet in the catalog
	written []upload.ObjectInfo               // packs written by this Op, for the upload queue
	reused  map[delta.ID]bool                 // packs of earlier sessions holding blobs this one reuses
	// children lists, for each new tree this Op stored, the blobs it
	// references: Publish counts them only for trees it is first to index.
	children map[delta.ID][]delta.ID
	stats    delta.Stats
	buf      []byte
	// unindexed are the packs this Op wrote (name -> blobs) while none of
	// its blobs is indexed yet: Discard may delete them.
	unindexed map[string][]delta.ID
	// prepared holds data blobs PrepareBlob compressed ahead, by ID, until
	// SaveBlob takes them; the only part of an Op used by other goroutines.
	prepMu   sync.Mutex
	prepared map[delta.ID]prepared
	// snap is the catalog snapshot the Op's dedup lookups read (one wait
	// for the commits in flight, not one per blob), opened at the first
	// lookup and closed by Publish and Discard; snapMu guards it.
	snapMu sync.Mutex
	snap   *catalog.Snapshot
	// prepBufs recycles PrepareBlob's output buffers: SaveBlob returns each
	// once PackWriter.Add has copied it, so a large turn does not allocate
	// its whole compressed size anew.
	prepBufs sync.Pool
}

// prepared is a blob's stored form, made ahead of its SaveBlob.
type prepared struct {
	stored []byte
	comp   delta.Compression
}

// New returns a repository over store, indexed by cat. meter may be nil.
func New(store upload.Store, cat *catalog.Catalog, codec *delta.Codec, meter *Meter) *Repo {
	return NewSealed(store, cat, codec, meter, nil)
}

// NewSealed is New for a store encrypted by keys (nil: plaintext): packs
// are written sealed blob by blob, and blobs opened as they are read.
func NewSealed(store upload.Store, cat *catalog.Catalog, codec *delta.Codec, meter *Meter, keys *delta.Keys) *Repo {
	return NewSealedIDs(store, cat, codec, meter, keys, keys.IDs())
}

// NewSealedIDs is NewSealed naming content under ids: a home whose local
// store is plaintext (nil keys) still names it with its keyed IDs.
func NewSealedIDs(store upload.Store, cat *catalog.Catalog, codec *delta.Codec, meter *Meter, keys *delta.Keys, ids delta.IDs) *Repo {
	r := &Repo{store: store, cat: cat, codec: codec, packs: newPackCache(), meter: meter, keys: keys, ids: ids}
	r.group.Hold = &r.indexMu
	return r
}

// Keys returns the store's keys, nil for a plaintext store.
func (r *Repo) Keys() *delta.Keys { return r.keys }

// IDs returns the store's content ID scheme.
func (r *Repo) IDs() delta.IDs { return r.ids }

// Store returns the store the repository reads and writes.
func (r *Repo) Store() upload.Store { return r.store }

// Begin starts a write session.
func (r *Repo) Begin() *Op {
	return &Op{
		r: r,
		open: map[delta.BlobType]*delta.PackWriter{
			delta.BlobData: delta.NewPackWriterFor(r.keys, r.ids), delta.BlobTree: delta.NewPackWriterFor(r.keys, r.ids),
		},
		flushed:   map[delta.ID]catalog.BlobLocation{},
		reused:    map[delta.ID]bool{},
		children:  map[delta.ID][]delta.ID{},
		unindexed: map[string][]delta.ID{},
		prepared:  map[delta.ID]prepared{},
	}
}

// Discard deletes the packs of an Op that failed before Publish indexed any
// of its blobs, so a checkpoint that ran out of space leaves nothing
// behind. A pack whose name some indexed blob points at is kept: another Op
// may have written the same bytes and indexed them. Best effort: a pack
// left behind is garbage that gc collects.
func (o *Op) Discard(ctx context.Context) {
	o.closeSnapshot()
	if len(o.unindexed) == 0 {
		return
	}
	o.r.indexMu.Lock()
	defer o.r.indexMu.Unlock()
	for name, ids := range o.unindexed {
		pack, _ := delta.ParsePackName(name)
		used := false
		o.r.cat.View(ctx, func(tx *catalog.Tx) error {
			for _, id := range ids {
				if loc, ok, err := tx.Blob(id); err != nil || ok && loc.Pack == pack {
					used = true // or unknown: keep it
					return err
				}
			}
			return nil
		})
		if !used {
			o.r.store.Delete(ctx, name)
		}
	}
	o.unindexed = map[string][]delta.ID{}
}

// Stats returns what the Op stored so far: BlobsNew, BytesNew, ObjectsNew.
func (o *Op) Stats() delta.Stats { return o.stats }

// Written lists the packs the Op wrote, in order.
func (o *Op) Written() []upload.ObjectInfo { return o.written }

// Reused lists the packs of other sessions holding blobs the Op's trees
// name: its record must not reach a remote store before they do.
func (o *Op) Reused() []delta.ID {
	out := make([]delta.ID, 0, len(o.reused))
	for p := range o.reused {
		out = append(out, p)
	}
	return out
}

// PrepareBlob implements fstree.BlobPreparer: it compresses a data blob
// the catalog does not know yet, on the caller's goroutine (an ingest
// pipeline worker), for the SaveBlob that follows. Safe for concurrent use
// with itself and with SaveBlob. The stored bytes are exactly what SaveBlob
// would make, so packs do not depend on whether blobs were prepared.
func (o *Op) PrepareBlob(ctx context.Context, t delta.BlobType, id delta.ID, plain []byte) {
	if t != delta.BlobData || uint64(len(plain)) > delta.MaxRawLength(t) {
		return
	}
	if _, known, err := o.lookupBlob(ctx, id); err != nil || known {
		return // SaveBlob decides (and reports the error) in order
	}
	p := prepared{comp: delta.CompressionZstd}
	var buf []byte
	if b, ok := o.prepBufs.Get().(*[]byte); ok {
		buf = (*b)[:0]
	}
	var ok bool
	if p.stored, ok = o.r.codec.Compress(buf, plain); !ok {
		o.putBuf(p.stored)
		p.stored, p.comp = nil, delta.CompressionNone
	}
	o.prepMu.Lock()
	o.prepared[id] = p
	o.prepMu.Unlock()
}

func (o *Op) putBuf(b []byte) {
	if cap(b) > 0 {
		b = b[:0]
		o.prepBufs.Put(&b)
	}
}

// takePrepared removes and returns what PrepareBlob made for id.
func (o *Op) takePrepared(id delta.ID) (prepared, bool) {
	o.prepMu.Lock()
	defer o.prepMu.Unlock()
	p, ok := o.prepared[id]
	if ok {
		delete(o.prepared, id)
	}
	return p, ok
}

// SaveBlob implements delta.BlobSaver: deduplicate against the catalog and
// this session, compress (unless PrepareBlob did), append to the open pack.
func (o *Op) SaveBlob(ctx context.Context, t delta.BlobType, id delta.ID, plain []byte) (bool, error) {
	r := o.r
	r.meter.add(len(plain))
	prep, isPrepared := o.takePrepared(id)
	if loc, ok := o.flushed[id]; (ok && !treeOverChunk(t, loc)) || o.open[t].Has(id) {
		return false, nil
	}
	loc, known, err := o.lookupBlob(ctx, id)
	if known && treeOverChunk(t, loc) {
		known = false // stored as a tree too, which takes the ID over (index)
	}
	if known {
		// A checkpoint that reuses a blob must not reach the remote store
		// before the pack holding it does.
		o.reused[loc.Pack] = true
	}
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
		// (A chunk list, stored as a tree blob, references its chunks.)
		refs, err := delta.BlobRefs(plain)
		if err != nil {
			return false, fmt.Errorf("tree %s: %w", id.Short(), err)
		}
		o.children[id] = refs
	}
	var stored []byte
	var comp delta.Compression
	switch {
	case isPrepared && t == delta.BlobData:
		stored, comp = prep.stored, prep.comp
		if comp == delta.CompressionNone {
			stored = plain
		}
	default:
		// PackWriter.Add copies, so one scratch buffer serves every blob. It
		// must never alias plain, which belongs to the caller (the chunker's
		// buffer).
		var ok bool
		stored, ok = r.codec.Compress(o.buf[:0], plain)
		o.buf = stored[:0]
		comp = delta.CompressionZstd
		if !ok {
			stored, comp = plain, delta.CompressionNone
		}
	}
	if w := o.open[t]; w.Len() >= reserveAfter && w.Len() < packTarget {
		// A large turn: size the pack once (appending would copy it at
		// every doubling, a sixth of a large turn's CPU); a small turn
		// never holds a 16 MiB buffer.
		w.Reserve(packTarget + 2*delta.ChunkMax)
	}
	o.open[t].Add(t, id, stored, len(plain), comp)
	if isPrepared {
		o.putBuf(prep.stored) // Add copied it
	}
	o.stats.BlobsNew++
	if o.open[t].Len() >= packTarget {
		if err := o.flushPack(ctx, t); err != nil {
			return false, err
		}
	}
	return true, nil
}

// treeOverChunk reports whether a tree of ID id must be stored although
// loc holds id already: loc holds it as a chunk (a file whose bytes are the
// tree's encoding, which anyone who can write a file can make). The bytes
// are the same, but a tree's children are counted when the tree is first
// stored (SaveBlob), and no one counted them for a chunk. So the tree is
// stored and indexed over the chunk's location (Op.index): either copy
// serves both types (Repo.load), and the children are counted once.
func treeOverChunk(t delta.BlobType, loc catalog.BlobLocation) bool {
	return t == delta.BlobTree && loc.Type == delta.BlobData
}

// flushPack writes the open pack of blob type t to the store.
func (o *Op) flushPack(ctx context.Context, t delta.BlobType) error {
	if o.open[t].Count() == 0 {
		return nil
	}
	if t == delta.BlobTree {
		// The trees may name chunks still in the open data pack.
		if err := o.flushPack(ctx, delta.BlobData); err != nil {
			return err
		}
	}
	data, id, entries, err := o.open[t].Finish()
	if err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	name := delta.PackName(id)
	if o.r.room != nil {
		// Before the pack, not after: a turn that does not fit is refused
		// before it fills the home, with the room check's figures.
		if err := o.r.room(uint64(len(data)), o.packBytes()); err != nil {
			return err
		}
	}
	if err := upload.PutBytes(ctx, o.r.store, name, data); err != nil {
		return fmt.Errorf("write pack %s: %w", name, err)
	}
	for _, e := range entries {
		o.flushed[e.ID] = LocationOf(id, e)
	}
	o.written = append(o.written, upload.ObjectInfo{Name: name, Size: int64(len(data))})
	if o.unindexed != nil {
		for _, e := range entries {
			o.unindexed[name] = append(o.unindexed[name], e.ID)
		}
	}
	o.stats.ObjectsNew++
	o.stats.BytesNew += int64(len(data))
	o.open[t] = delta.NewPackWriterFor(o.r.keys, o.r.ids)
	return nil
}

// LocationOf is where entry e of pack pack lives, as the catalog indexes it.
func LocationOf(pack delta.ID, e delta.PackEntry) catalog.BlobLocation {
	return catalog.BlobLocation{
		Pack: pack, Type: e.Type, Offset: e.Offset, Length: e.Length,
		RawLength: e.RawLength, Compression: uint8(e.Compression),
	}
}

// LoadBlob implements delta.BlobLoader for the Op: its own unpublished
// blobs, then the repository's.
func (o *Op) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	if loc, ok := o.flushed[id]; ok {
		return o.r.load(ctx, t, id, loc)
	}
	return o.r.LoadBlob(ctx, t, id)
}

// LoadBlob implements delta.BlobLoader: locate, read, decompress, verify.
func (r *Repo) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	var loc catalog.BlobLocation
	var ok bool
	{
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
	return r.load(ctx, t, id, loc)
}

// load reads blob id of type t from where loc says it is.
func (r *Repo) load(ctx context.Context, t delta.BlobType, id delta.ID, loc catalog.BlobLocation) ([]byte, error) {
	// loc may hold the blob as the other type: an ID is the hash of the
	// plaintext, so a chunk and a tree of one ID are the same bytes, and
	// the index keeps whichever was stored first. Anyone who can write a
	// file can give it a tree's encoding (another sandbox's, dedup being
	// store-wide); refusing the stored copy made that tree, or that file,
	// unreadable. The stored type opens and decodes it; both types'
	// limits bound it.
	name := delta.PackName(loc.Pack)
	// Bound what the index declares before it sizes any read or buffer: a
	// stored blob is never much larger than its plaintext.
	if most := min(delta.MaxRawLength(t), delta.MaxRawLength(loc.Type)); loc.RawLength > most || loc.Length > 2*most {
		return nil, fmt.Errorf("blob %s in %s: declares %d stored and %d plain bytes, over the %s limit %d: %w",
			id, name, loc.Length, loc.RawLength, t, most, errdefs.ErrCorrupt)
	}
	pack, ok := r.packs.get(loc.Pack)
	if !ok && r.packs.wantWhole(loc.Pack) {
		data, err := upload.ReadAllMax(ctx, r.store, name, delta.MaxPackSize)
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
		return r.Decode(id, name, loc, pack[loc.Offset:end])
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
	return r.Decode(id, name, loc, stored)
}

// Decode turns a blob's stored bytes, read from object, back into verified
// plaintext (delta.Codec.DecodeBlob: bounded, hash-checked).
func (r *Repo) Decode(id delta.ID, object string, loc catalog.BlobLocation, stored []byte) ([]byte, error) {
	if uint64(len(stored)) != loc.Length {
		return nil, fmt.Errorf("blob %s in %s: read %d bytes, want %d: %w", id, object, len(stored), loc.Length, errdefs.ErrCorrupt)
	}
	stored, err := r.keys.OpenBlob(loc.Type, id, stored)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, object)
	}
	comp := delta.Compression(loc.Compression)
	if comp != delta.CompressionNone && comp != delta.CompressionZstd {
		return nil, fmt.Errorf("blob %s in %s: unknown compression %d: %w", id, object, loc.Compression, errdefs.ErrCorrupt)
	}
	plain, err := r.codec.DecodeBlob(r.ids, loc.Type, id, comp == delta.CompressionZstd, loc.RawLength, stored)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, object)
	}
	r.meter.add(len(plain))
	return plain, nil
}

// LoaderFor returns a loader that finds blobs in locs before asking the
// catalog: rebuild reads a store whose index it is still making.
func (r *Repo) LoaderFor(locs map[delta.ID]catalog.BlobLocation) delta.BlobLoader {
	return locLoader{r, locs}
}

type locLoader struct {
	r    *Repo
	locs map[delta.ID]catalog.BlobLocation
}

func (l locLoader) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	if loc, ok := l.locs[id]; ok {
		return l.r.load(ctx, t, id, loc)
	}
	return l.r.LoadBlob(ctx, t, id)
}

// lookupBlob is the Op's dedup lookup: where the catalog has blob id, as of
// the Op's snapshot. A blob another Op indexed since is found new and
// stored again, which Publish settles (the dedup rule).
func (o *Op) lookupBlob(ctx context.Context, id delta.ID) (catalog.BlobLocation, bool, error) {
	o.snapMu.Lock()
	if o.snap == nil {
		s, err := o.r.cat.Snapshot(ctx)
		if err != nil {
			o.snapMu.Unlock()
			return catalog.BlobLocation{}, false, err
		}
		o.snap = s
	}
	s := o.snap
	o.snapMu.Unlock()
	var loc catalog.BlobLocation
	var ok bool
	err := s.View(ctx, func(tx *catalog.Tx) error {
		var err error
		loc, ok, err = tx.Blob(id)
		return err
	})
	return loc, ok, err
}

// closeSnapshot ends the Op's snapshot; a later lookup opens a new one.
func (o *Op) closeSnapshot() {
	o.snapMu.Lock()
	defer o.snapMu.Unlock()
	if o.snap != nil {
		o.snap.Close()
		o.snap = nil
	}
}
