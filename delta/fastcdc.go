package delta

import (
	"encoding/binary"
	"io"
)

// FastCDC (Xia et al., USENIX ATC 2016): a gear rolling hash, no cut before
// ChunkMin, a harder mask (more bits) below ChunkAverage and an easier one
// above it ("normalised chunking", level 2), a forced cut at ChunkMax. Our
// own implementation: the library we first used (jotfs/fastcdc-go) XORs a
// package-level table on every NewChunker call, a data race between any two
// concurrent chunkers (found by `go test -race`), and the race-free Go
// implementations are not on our module proxy. Owning the loop also lets a
// Chunker reuse one buffer for every file it cuts.

// gearSeed names the gear table. Changing it changes every chunk boundary
// (readers are unaffected; only deduplication against older chunks is).
const gearSeed = "turnsnap/fastcdc/gear/v1"

// gearTable holds 256 pseudo-random 64-bit values: entry i is the first 8
// bytes, little-endian, of BLAKE3(gearSeed || i). It is computed once and
// never written again, so concurrent chunkers share it safely.
var gearTable = func() (t [256]uint64) {
	for i := range t {
		h := Hash(append([]byte(gearSeed), byte(i)))
		t[i] = binary.LittleEndian.Uint64(h[:8])
	}
	return t
}()

// Masks for normalisation level 2 around a 64 KiB (2^16) average: 18 bits
// before the average point (cuts are 4x rarer), 14 after (4x likelier).
const (
	maskHard = uint64(1)<<18 - 1
	maskEasy = uint64(1)<<14 - 1
)

// cutPoint returns the length of the chunk that starts data. data holds at
// least ChunkMax bytes unless it is the input's tail.
func cutPoint(data []byte) int {
	n := len(data)
	if n <= ChunkMin {
		return n
	}
	n = min(n, ChunkMax)
	normal := min(n, ChunkAverage)
	var fp uint64
	i := ChunkMin
	for ; i < normal; i++ {
		fp = fp<<1 + gearTable[data[i]]
		if fp&maskHard == 0 {
			return i + 1
		}
	}
	for ; i < n; i++ {
		fp = fp<<1 + gearTable[data[i]]
		if fp&maskEasy == 0 {
			return i + 1
		}
	}
	return n
}

// cutStream chunks r through buf (len(buf) >= 2*ChunkMax), calling fn with
// each chunk; chunk bytes are valid only during the call.
func cutStream(r io.Reader, buf []byte, fn func([]byte) error) error {
	start, end, eof := 0, 0, false
	for {
		if !eof && end-start < ChunkMax {
			end = copy(buf, buf[start:end])
			start = 0
			n, err := io.ReadFull(r, buf[end:])
			end += n
			switch err {
			case nil:
			case io.EOF, io.ErrUnexpectedEOF:
				eof = true
			default:
				return err
			}
		}
		if start == end {
			return nil
		}
		k := cutPoint(buf[start:end])
		if err := fn(buf[start : start+k]); err != nil {
			return err
		}
		start += k
	}
}
