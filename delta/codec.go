package delta

import (
	"fmt"
	"io"
	"runtime"

	"github.com/klauspost/compress/zstd"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Chunk size bounds for content-defined chunking. A 64 KiB average keeps the
// dedup granularity fine enough that a small edit in a big file, or a few
// dirtied pages in a CRIU image, costs tens of KiB rather than megabytes,
// while 20,000-file trees still produce few enough chunks that per-chunk
// bookkeeping stays negligible next to reading the bytes. These values are
// part of the format only in the sense that changing them stops new chunks
// from deduplicating against old ones.
const (
	ChunkMin     = 16 << 10
	ChunkAverage = 64 << 10
	ChunkMax     = 256 << 10
)

// ChunkReader cuts r into content-defined chunks (FastCDC, see fastcdc.go)
// and calls fn with each chunk's bytes, which are valid only during the
// call. A file shorter than ChunkMin is one chunk; an empty file has none.
func ChunkReader(r io.Reader, fn func(data []byte) error) error {
	return NewChunker().Chunk(r, -1, fn)
}

// Chunker cuts many files in a row through one buffer. It cuts exactly as
// ChunkReader does. Not safe for concurrent use; use one per goroutine.
type Chunker struct{ buf, small []byte }

// NewChunker returns a Chunker.
func NewChunker() *Chunker { return &Chunker{} }

// Chunk is ChunkReader for a reader of known size (-1 if unknown); knowing
// the size lets a small file skip the large buffer.
func (c *Chunker) Chunk(r io.Reader, size int64, fn func(data []byte) error) error {
	if size >= 0 && size < ChunkMin {
		// One chunk by definition. A file that grew while we read it yields
		// a wrong chunk here; the scanner re-stats after reading and
		// retries, so it is never kept.
		if c.small == nil {
			c.small = make([]byte, ChunkMin)
		}
		n, err := io.ReadFull(r, c.small)
		if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
			return err
		}
		if n == 0 {
			return nil
		}
		return fn(c.small[:n])
	}
	if c.buf == nil {
		c.buf = make([]byte, 2*ChunkMax)
	}
	return cutStream(r, c.buf, fn)
}

// Codec compresses and decompresses blobs with zstd. One Codec is safe for
// concurrent use; create it once per process (the encoder keeps sizeable
// tables) and pass it where needed.
type Codec struct {
	enc *zstd.Encoder
	dec *zstd.Decoder
}

// Workers is the number of workers n asks for: n itself, or GOMAXPROCS
// for 0. It sizes fstree's ingest pipeline and the Codec's encoders alike.
func Workers(n int) int {
	if n <= 0 {
		return runtime.GOMAXPROCS(0)
	}
	return n
}

// NewCodec returns a Codec at zstd's fastest level: on our 2-core machines
// the fastest level compresses 64 KiB chunks at about 3 GB/s against 2.5 GB/s
// for the default level, and checkpoints are on the agent's critical path.
// It keeps one encoder per core (GOMAXPROCS), so that the ingest
// pipeline's workers compress side by side; EncodeAll with one encoder
// would serialise them. Each call still runs on its caller's goroutine.
func NewCodec() (*Codec, error) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(Workers(0)))
	if err != nil {
		return nil, fmt.Errorf("zstd encoder: %w", err)
	}
	// DecodeAll stops at the capacity of the buffer it is given
	// (Decompress sizes it to the declared length + 1), so a small frame
	// that inflates to gigabytes costs one blob's worth of memory. The
	// memory bound also caps the window a frame may ask for.
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderMaxMemory(2*MaxTreeSize), zstd.WithDecodeAllCapLimit(true))
	if err != nil {
		return nil, fmt.Errorf("zstd decoder: %w", err)
	}
	return &Codec{enc: enc, dec: dec}, nil
}

// Compress appends the zstd frame of plain to dst. ok is false when
// compression would not save at least 1/16 of the size; the caller then
// stores the plaintext as is (already-compressed files, random data).
func (c *Codec) Compress(dst, plain []byte) (out []byte, ok bool) {
	start := len(dst)
	out = c.enc.EncodeAll(plain, dst)
	if len(out)-start > len(plain)-len(plain)/16 {
		return out[:start], false
	}
	return out, true
}

// Decompress returns the plaintext of a zstd frame whose plaintext is
// rawLen bytes long; any other length is corruption. It never produces
// more than rawLen+1 bytes, and rawLen must already be bounded (DecodeBlob,
// MaxRawLength).
func (c *Codec) Decompress(frame []byte, rawLen int) ([]byte, error) {
	if rawLen < 0 || rawLen > MaxTreeSize {
		return nil, fmt.Errorf("zstd: declared plaintext of %d bytes is over the limit %d: %w", rawLen, MaxTreeSize, errdefs.ErrCorrupt)
	}
	// One byte of room beyond the declared length tells "exactly rawLen"
	// from "more than rawLen" without decoding the rest.
	out, err := c.dec.DecodeAll(frame, make([]byte, 0, rawLen+1))
	if err != nil {
		return nil, fmt.Errorf("zstd: %v: %w", err, errdefs.ErrCorrupt)
	}
	if len(out) != rawLen {
		return nil, fmt.Errorf("zstd: plaintext is %d bytes, want %d: %w", len(out), rawLen, errdefs.ErrCorrupt)
	}
	return out, nil
}

// DecodeBlob turns a blob's stored bytes back into its plaintext and checks
// it hashes to id under ids, the home's scheme: the one blob decoder every
// reader uses. rawLen is the
// declared plaintext length, bounded by MaxRawLength(t) before anything is
// allocated. Errors wrap errdefs.ErrCorrupt; the caller names the object.
func (c *Codec) DecodeBlob(ids IDs, t BlobType, id ID, compressed bool, rawLen uint64, stored []byte) ([]byte, error) {
	if most := MaxRawLength(t); rawLen > most {
		return nil, fmt.Errorf("blob %s: %s blob declares %d bytes, more than the limit %d: %w", id, t, rawLen, most, errdefs.ErrCorrupt)
	}
	plain := stored
	if compressed {
		var err error
		if plain, err = c.Decompress(stored, int(rawLen)); err != nil {
			return nil, fmt.Errorf("blob %s: %w", id, err)
		}
	} else if uint64(len(stored)) != rawLen {
		return nil, fmt.Errorf("blob %s: %d stored bytes, declared %d: %w", id, len(stored), rawLen, errdefs.ErrCorrupt)
	}
	if got := ids.Hash(plain); got != id {
		return nil, fmt.Errorf("blob %s: content hashes to %s: %w", id, got.Short(), errdefs.ErrCorrupt)
	}
	return plain, nil
}

// Close releases the codec's resources.
func (c *Codec) Close() {
	c.enc.Close()
	c.dec.Close()
}
