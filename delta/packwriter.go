package delta

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// PackWriter builds one pack in memory. Packs are meant to be a few MiB to
// a few tens of MiB (the caller flushes when Len reaches its target), so
// holding one is cheaper than the second pass a streamed pack would need to
// hash itself.
//
// Misuse (an unknown type, a duplicate blob, Add after Finish) is sticky,
// as in archive/tar: Add has nothing to return it with, so Finish reports
// the first one and no pack is made.
//
// A PackWriter is not safe for concurrent use and builds one pack; start a
// new one after Finish.
type PackWriter struct {
	data    []byte
	entries []PackEntry
	ids     map[ID]bool
	err     error
	done    bool
	keys    *Keys // nil: a plaintext pack
	scheme  IDs   // names the finished pack
}

// NewPackWriter returns an empty PackWriter.
func NewPackWriter() *PackWriter {
	return &PackWriter{ids: map[ID]bool{}}
}

// NewPackWriter returns an empty PackWriter for a store sealed by k: each
// blob's stored bytes are sealed on Add, the header on Finish. With nil k
// it is the package-level NewPackWriter.
func (k *Keys) NewPackWriter() *PackWriter { return NewPackWriterFor(k, k.IDs()) }

// NewPackWriterFor returns an empty PackWriter whose pack is sealed by k
// (nil: plaintext) and named under ids: a home whose local store is
// plaintext writes plaintext packs named by its keyed IDs.
func NewPackWriterFor(k *Keys, ids IDs) *PackWriter {
	w := NewPackWriter()
	w.keys, w.scheme = k, ids
	return w
}

// Reserve makes room for a pack of n bytes, so that a writer filling a
// large pack copies its bytes once instead of at every doubling.
func (w *PackWriter) Reserve(n int) {
	if n > cap(w.data) {
		w.data = slices.Grow(w.data, n-len(w.data))
	}
}

// Add appends a blob: its type, its ID (the hash of its plaintext), its
// stored bytes, its plaintext length and how the stored bytes encode the
// plaintext. Add copies stored, so the caller may reuse it.
func (w *PackWriter) Add(t BlobType, id ID, stored []byte, rawLen int, c Compression) {
	if w.err != nil {
		return
	}
	var why string
	switch {
	case w.done:
		why = "Add after Finish"
	case !knownBlobType(t):
		why = fmt.Sprintf("unknown type %d", uint8(t))
	case !c.known():
		why = fmt.Sprintf("unknown compression %d", uint8(c))
	case rawLen < 0:
		why = fmt.Sprintf("negative raw length %d", rawLen)
	case c == CompressionNone && rawLen != len(stored):
		why = fmt.Sprintf("uncompressed but raw length %d differs from stored length %d", rawLen, len(stored))
	case w.ids[id]:
		why = "already in this pack (check Has first)"
	}
	if why != "" {
		w.err = fmt.Errorf("pack writer: blob %s: %s: %w", id, why, errdefs.ErrInvalid)
		return
	}
	start := len(w.data)
	if w.keys != nil {
		w.data = w.keys.seal(w.data, stored, blobAD(t, id))
	} else {
		w.data = append(w.data, stored...)
	}
	w.entries = append(w.entries, PackEntry{
		Type:        t,
		ID:          id,
		Offset:      uint64(start),
		Length:      uint64(len(w.data) - start),
		RawLength:   uint64(rawLen),
		Compression: c,
	})
	w.ids[id] = true
}

// Absorb moves every blob of o after w's, leaving o empty, so that two
// small packs become one object. o must build packs for the same keys and
// ID scheme as w: its stored bytes move as they are (a sealed blob's
// associated data names its type and ID, never its offset); misuse is
// sticky in w, as for Add. It reports false, changing neither, when a blob
// ID is in both (the same bytes stored as a chunk and as a tree): a pack
// holds an ID once.
func (w *PackWriter) Absorb(o *PackWriter) bool {
	if w.err != nil {
		return false
	}
	var why string
	switch {
	case o.err != nil:
		w.err = o.err
		return false
	case w.done || o.done:
		why = "Absorb after Finish"
	case w.keys != o.keys || w.scheme != o.scheme:
		why = "packs for different keys"
	}
	if why != "" {
		w.err = fmt.Errorf("pack writer: %s: %w", why, errdefs.ErrInvalid)
		return false
	}
	for _, e := range o.entries {
		if w.ids[e.ID] {
			return false
		}
	}
	shift := uint64(len(w.data))
	w.data = append(w.data, o.data...)
	for _, e := range o.entries {
		e.Offset += shift
		w.entries = append(w.entries, e)
		w.ids[e.ID] = true
	}
	o.data, o.entries, o.ids = nil, nil, map[ID]bool{}
	return true
}

// Len returns the number of blob bytes added so far. The header and footer
// add 8 bytes plus 37 to about 60 per blob.
func (w *PackWriter) Len() int { return len(w.data) }

// Count returns the number of blobs added so far.
func (w *PackWriter) Count() int { return len(w.entries) }

// Has reports whether a blob with this ID is already in the pack.
func (w *PackWriter) Has(id ID) bool { return w.ids[id] }

// Finish appends the header and footer and returns the pack's bytes, its ID
// and its entries. Before returning it decodes the header it wrote and
// checks it against the entries, as restic does. An empty pack is an error:
// a caller flushing one has lost track of what it holds.
func (w *PackWriter) Finish() (data []byte, id ID, entries []PackEntry, err error) {
	switch {
	case w.err != nil:
		return nil, id, nil, w.err
	case w.done:
		return nil, id, nil, fmt.Errorf("pack writer: Finish called twice: %w", errdefs.ErrInvalid)
	}
	w.done = true
	if len(w.entries) == 0 {
		return nil, id, nil, fmt.Errorf("pack writer: no blobs: %w", errdefs.ErrInvalid)
	}
	data, entries = w.data, w.entries
	w.data, w.entries = nil, nil
	hstart := len(data)
	data = appendHeader(data, entries)
	if w.keys != nil {
		header := bytes.Clone(data[hstart:])
		data = w.keys.seal(data[:hstart], header, []byte(adHeader))
	}
	hlen := len(data) - hstart
	if hlen > math.MaxUint32 {
		return nil, id, nil, fmt.Errorf("pack writer: %d-byte header exceeds the format's 4 GiB limit: %w", hlen, errdefs.ErrInvalid)
	}
	data = w.keys.appendFooter(data, hlen)
	id = w.scheme.Hash(data)
	if err := w.keys.verifyPack(data, id, entries); err != nil {
		return nil, ID{}, nil, err
	}
	return data, id, entries, nil
}

// appendHeader appends the encoded header for entries to b. It does not
// validate; PackWriter.Add does.
func appendHeader(b []byte, entries []PackEntry) []byte {
	b = binary.AppendUvarint(b, uint64(len(entries)))
	for _, e := range entries {
		b = append(b, byte(e.Type))
		b = append(b, e.ID[:]...)
		b = binary.AppendUvarint(b, e.Offset)
		b = binary.AppendUvarint(b, e.Length)
		b = binary.AppendUvarint(b, e.RawLength)
		b = append(b, byte(e.Compression))
	}
	return b
}

// appendFooter appends the footer for a header of hlen bytes.
func (k *Keys) appendFooter(b []byte, hlen int) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(hlen))
	if k != nil {
		return append(b, sealedMagic...)
	}
	return append(b, packMagic...)
}

// verifyPack decodes the header of a pack just built and checks that it
// says what was meant, so an encoder bug stops the checkpoint that hit it
// instead of surfacing at restore time.
func (k *Keys) verifyPack(data []byte, id ID, want []PackEntry) error {
	got, err := k.parsePack(data)
	if err != nil {
		return fmt.Errorf("pack %s: new pack does not parse: %w", id, err)
	}
	if !slices.Equal(got, want) {
		return fmt.Errorf("pack %s: new pack's header does not decode to what was written: %w", id, errdefs.ErrCorrupt)
	}
	return nil
}
