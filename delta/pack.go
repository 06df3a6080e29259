package delta

// Pack format, version 1.
//
// A pack is one object holding many blobs, so that a checkpoint of 5,000
// small files costs a handful of objects (and requests) rather than 5,000.
// Blobs come first and the header last, so a writer streams blobs out
// without knowing how many will follow, and a reader finds the header from
// the end of the object with one ranged read.
//
//	Pack   = Blob_1 || ... || Blob_n || Header || Footer
//	Header = uvarint(n) || Entry_1 || ... || Entry_n
//	Entry  = u8 type || ID (32 bytes) || uvarint offset || uvarint length ||
//	         uvarint raw_length || u8 compression
//	Footer = u32le(len(Header)) || "TSP1"
//
// uvarint is the unsigned LEB128 varint of encoding/binary (PutUvarint):
// seven bits per byte, least significant group first, high bit set on
// every byte but the last. u32le is four bytes, little-endian. The magic
// "TSP1" (54 53 50 31) names the format and its version; a reader rejects
// any other.
//
//   - type is the BlobType of the blob's plaintext: 1 data, 2 tree.
//   - ID is the blob's ID: the BLAKE3-256 hash of its plaintext, not
//     of its stored bytes.
//   - offset and length locate the blob's stored bytes in the pack, counted
//     from the pack's first byte.
//   - raw_length is the length of the plaintext.
//   - compression says how the stored bytes encode the plaintext: 0 none
//     (stored bytes are the plaintext, so raw_length equals length), 1 one
//     zstd frame.
//
// Rules, which ParsePackHeader enforces and PackWriter never breaks:
//   - Blob_i is stored at offset_i with length_i; offset_1 is 0 and each
//     blob starts where the previous one ends (offset_{i+1} = offset_i +
//     length_i), so blobs are in ascending offset order, do not overlap and
//     leave no gaps.
//   - The last blob ends exactly where the header starts, which is
//     len(Pack) - 8 - len(Header). A pack of zero blobs, Header || Footer,
//     is valid to read, but PackWriter never makes one.
//   - The header holds exactly n entries and nothing after them.
//   - A pack holds a blob ID at most once.
//   - Unknown types and compressions are corruption, not extensions: a new
//     one needs a new magic.
//   - raw_length is at most MaxRawLength(type): a chunk's maximum for
//     data, MaxTreeSize for trees.
//
// A pack's ID is Hash of all its bytes, and it is stored under
// PackName(ID) = "packs/" || first two hex digits of ID || "/" || hex ID.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// MaxPackSize is the largest pack a reader accepts. Writers close a pack
// once it passes 16 MiB, so a pack is at most that plus one blob.
const MaxPackSize = 256 << 20

// PackPrefix starts the name of every pack; List(ctx, PackPrefix, fn) visits
// them all.
const PackPrefix = "packs/"

const (
	packMagic      = "TSP1"
	packFooterSize = 8 // u32le header length, then the magic
	// minEntrySize is the smallest encoded header entry (one-byte varints).
	// It bounds the blob count a header can claim, so a corrupt count cannot
	// make a reader allocate gigabytes.
	minEntrySize = 1 + len(ID{}) + 1 + 1 + 1 + 1
	// packTailRead is how much ReadPackHeader reads from the end of a pack
	// at first. Entries are 37 to about 60 bytes, so this holds the header
	// of a pack of a few hundred blobs: one round trip for most packs, two
	// for the rest.
	packTailRead = 16 << 10
)

// Compression says how a blob's stored bytes encode its plaintext. The
// values are part of the pack format; never renumber them.
type Compression uint8

const (
	// CompressionNone stores the plaintext as is.
	CompressionNone Compression = 0
	// CompressionZstd stores one zstd frame of the plaintext.
	CompressionZstd Compression = 1
)

func (c Compression) String() string {
	switch c {
	case CompressionNone:
		return "none"
	case CompressionZstd:
		return "zstd"
	}
	return fmt.Sprintf("compression(%d)", uint8(c))
}

func (c Compression) known() bool { return c == CompressionNone || c == CompressionZstd }

func (k *Keys) packMagic() string {
	if k != nil {
		return sealedMagic
	}
	return packMagic
}

func knownBlobType(t BlobType) bool { return t == BlobData || t == BlobTree }

// PackEntry locates one blob in a pack.
type PackEntry struct {
	Type BlobType
	ID   ID
	// Offset and Length locate the stored (possibly compressed) bytes.
	Offset, Length uint64
	// RawLength is the plaintext length, so a reader can size its buffer
	// before decompressing.
	RawLength   uint64
	Compression Compression
}

// PackName returns the object name of the pack with the given ID. The
// two-digit directory keeps any one directory of a local store, or listing
// of a bucket, to a few hundred entries.
func PackName(id ID) string {
	h := id.String()
	return PackPrefix + h[:2] + "/" + h
}

// ParsePackName returns the ID of the pack stored under name, or false if
// name is not exactly what PackName would give for some ID.
func ParsePackName(name string) (ID, bool) {
	rest, ok := strings.CutPrefix(name, PackPrefix)
	if !ok || len(rest) != 3+2*len(ID{}) {
		return ID{}, false
	}
	id, err := ParseID(rest[3:])
	if err != nil || PackName(id) != name {
		return ID{}, false
	}
	return id, true
}

// ParsePackHeader decodes and validates the header of a whole pack. Errors
// wrap errdefs.ErrCorrupt and name the pack by the hash of data, which is
// its ID if the caller checked it first, as readers of a whole pack should.
func ParsePackHeader(data []byte) ([]PackEntry, error) { return (*Keys)(nil).ParsePackHeader(data) }

// ParsePackHeader is the package-level ParsePackHeader for a store sealed
// by k: the header is opened, then checked like a plaintext one.
func (k *Keys) ParsePackHeader(data []byte) ([]PackEntry, error) {
	entries, err := k.parsePack(data)
	if err != nil {
		return nil, fmt.Errorf("pack %s: %w", k.IDs().Hash(data), err)
	}
	return entries, nil
}

func (k *Keys) parsePack(data []byte) ([]PackEntry, error) {
	size := int64(len(data))
	hlen, err := k.parseFooter(data[max(0, size-packFooterSize):], size)
	if err != nil {
		return nil, err
	}
	start := size - packFooterSize - hlen
	return k.parseHeader(data[start:size-packFooterSize], uint64(start))
}

// RangeReader is what ReadPackHeader needs of a store: an object's size and
// a read of part of it. upload.Ranges adapts any upload.Store.
type RangeReader interface {
	ObjectSize(ctx context.Context, name string) (int64, error)
	ReadRange(ctx context.Context, name string, off, n int64) (io.ReadCloser, error)
}

// ReadPackHeader reads and validates the header of the pack stored under
// name, fetching only the end of the object. Malformed headers are errors
// wrapping errdefs.ErrCorrupt; store errors pass through as they are.
func ReadPackHeader(ctx context.Context, s RangeReader, name string) ([]PackEntry, error) {
	return (*Keys)(nil).ReadPackHeader(ctx, s, name)
}

// ReadPackHeader is the package-level ReadPackHeader for a store sealed by k.
func (k *Keys) ReadPackHeader(ctx context.Context, s RangeReader, name string) ([]PackEntry, error) {
	size, err := s.ObjectSize(ctx, name)
	if err != nil {
		return nil, err
	}
	if size > MaxPackSize {
		return nil, fmt.Errorf("pack %s: %d bytes, more than the limit %d: %w", name, size, MaxPackSize, errdefs.ErrCorrupt)
	}
	if size < packFooterSize {
		_, err := k.parseFooter(nil, size)
		return nil, fmt.Errorf("pack %s: %w", name, err)
	}
	tail, err := readRange(ctx, s, name, size-min(size, packTailRead), min(size, packTailRead))
	if err != nil {
		return nil, err
	}
	hlen, err := k.parseFooter(tail[len(tail)-packFooterSize:], size)
	if err != nil {
		return nil, fmt.Errorf("pack %s: %w", name, err)
	}
	need := hlen + packFooterSize
	if missing := need - int64(len(tail)); missing > 0 {
		more, err := readRange(ctx, s, name, size-need, missing)
		if err != nil {
			return nil, err
		}
		tail = append(more, tail...)
	}
	header := tail[int64(len(tail))-need : len(tail)-packFooterSize]
	entries, err := k.parseHeader(header, uint64(size-need))
	if err != nil {
		return nil, fmt.Errorf("pack %s: %w", name, err)
	}
	return entries, nil
}

// readRange reads exactly n bytes of name at off. Packs never change, so an
// object shorter than its Stat said is corrupt, not a race.
func readRange(ctx context.Context, s RangeReader, name string, off, n int64) ([]byte, error) {
	rc, err := s.ReadRange(ctx, name, off, n)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	buf := make([]byte, n)
	if _, err := io.ReadFull(rc, buf); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("pack %s: shorter than its stated size: %w", name, errdefs.ErrCorrupt)
		}
		return nil, fmt.Errorf("pack %s: %w", name, err)
	}
	return buf, nil
}

// corrupt returns an error wrapping errdefs.ErrCorrupt.
func corrupt(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), errdefs.ErrCorrupt)
}

// parseFooter checks the footer of a pack of size bytes and returns the
// header length it gives.
func (k *Keys) parseFooter(footer []byte, size int64) (int64, error) {
	if size < packFooterSize || len(footer) != packFooterSize {
		return 0, corrupt("%d bytes is too short for a pack", size)
	}
	switch magic := string(footer[4:]); {
	case magic == sealedMagic && k == nil:
		return 0, keyError("the pack is encrypted and no key was given")
	case magic == packMagic && k != nil:
		return 0, corrupt("a plaintext pack in an encrypted store")
	case magic != packMagic && magic != sealedMagic:
		return 0, corrupt("bad magic %q, want %q", magic, k.packMagic())
	}
	hlen := int64(binary.LittleEndian.Uint32(footer))
	if hlen > size-packFooterSize {
		return 0, corrupt("header length %d does not fit in a %d-byte pack", hlen, size)
	}
	return hlen, nil
}

// parseHeader decodes a header that starts at offset start in its pack, and
// checks every rule of the format.
func (keys *Keys) parseHeader(header []byte, start uint64) ([]PackEntry, error) {
	var overhead uint64
	if keys != nil {
		var err error
		if header, err = keys.open(header, []byte(adHeader)); err != nil {
			return nil, keyError("header: %v: the store's data key does not open it (a wrong key, or tampering)", err)
		}
		overhead = SealOverhead
	}
	n, k := binary.Uvarint(header)
	if k <= 0 {
		return nil, corrupt("header: bad blob count")
	}
	b := header[k:]
	if most := uint64(len(b) / minEntrySize); n > most {
		return nil, corrupt("header: %d blobs claimed, room for at most %d", n, most)
	}
	entries := make([]PackEntry, 0, n)
	seen := make(map[ID]bool, n)
	var next uint64 // where the next blob must start
	for i := range n {
		var e PackEntry
		if len(b) < 1+len(e.ID) {
			return nil, corrupt("header: entry %d: truncated", i)
		}
		e.Type = BlobType(b[0])
		copy(e.ID[:], b[1:])
		b = b[1+len(e.ID):]
		var ok bool
		for _, f := range []*uint64{&e.Offset, &e.Length, &e.RawLength} {
			if *f, b, ok = uvarint(b); !ok {
				return nil, corrupt("header: entry %d (blob %s): bad varint", i, e.ID)
			}
		}
		if len(b) < 1 {
			return nil, corrupt("header: entry %d (blob %s): truncated", i, e.ID)
		}
		e.Compression = Compression(b[0])
		b = b[1:]
		if why := checkEntry(e, next, start, overhead, seen); why != "" {
			return nil, corrupt("header: entry %d (blob %s): %s", i, e.ID, why)
		}
		seen[e.ID] = true
		next = e.Offset + e.Length
		entries = append(entries, e)
	}
	if len(b) != 0 {
		return nil, corrupt("header: %d bytes after the last entry", len(b))
	}
	if next != start {
		return nil, corrupt("header: blobs end at %d but the header starts at %d", next, start)
	}
	return entries, nil
}

// checkEntry returns why e breaks the format, given that it must start at
// next and end by start, or "".
func checkEntry(e PackEntry, next, start, overhead uint64, seen map[ID]bool) string {
	switch {
	case e.Length < overhead:
		return fmt.Sprintf("length %d is shorter than sealing adds", e.Length)
	case !knownBlobType(e.Type):
		return fmt.Sprintf("unknown type %d", uint8(e.Type))
	case !e.Compression.known():
		return fmt.Sprintf("unknown compression %d", uint8(e.Compression))
	case e.Offset < next:
		return fmt.Sprintf("offset %d overlaps the previous blob, which ends at %d", e.Offset, next)
	case e.Offset > next:
		return fmt.Sprintf("offset %d leaves a gap after the previous blob, which ends at %d", e.Offset, next)
	case e.Length > start-e.Offset:
		return fmt.Sprintf("length %d at offset %d runs past the header at %d", e.Length, e.Offset, start)
	case e.RawLength > MaxRawLength(e.Type):
		return fmt.Sprintf("raw length %d is over the %s limit %d", e.RawLength, e.Type, MaxRawLength(e.Type))
	case e.Compression == CompressionNone && e.RawLength != e.Length-overhead:
		return fmt.Sprintf("uncompressed but raw length %d differs from stored length %d", e.RawLength, e.Length-overhead)
	case seen[e.ID]:
		return "blob appears twice"
	}
	return ""
}

func uvarint(b []byte) (uint64, []byte, bool) {
	v, k := binary.Uvarint(b)
	if k <= 0 {
		return 0, b, false
	}
	return v, b[k:], true
}
