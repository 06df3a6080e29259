package fstree

import (
	"bytes"
	"crypto/sha256"
	"github.com/turnsnap/turnsnap/delta"
	"math/rand"
	"strconv"
	"strings"
	"testing"
)

// benchData is 64 MiB: half source-like text (words repeat, so it
// compresses about as well as real code) and half random bytes (compressed
// images, binaries) that compression cannot shrink.
func benchData() []byte {
	b := make([]byte, 0, 64<<20)
	rng := rand.New(rand.NewSource(1))
	words := strings.Fields("func return err nil ctx if for range { } := string int \n\t // type struct")
	for len(b) < cap(b)/2 {
		b = append(b, words[rng.Intn(len(words))]...)
		b = append(b, ' ')
		if rng.Intn(10) == 0 {
			b = strconv.AppendInt(b, rng.Int63n(1e6), 10)
		}
	}
	b = b[:cap(b)/2]
	tail := make([]byte, cap(b)-len(b))
	rng.Read(tail)
	return append(b, tail...)
}

// BenchmarkContent measures the content pipeline phase by phase. Baselines
// in the same run: "hash-sha256" against "hash-blake3" (the choice of hash),
// and each phase against the one before it.
func BenchmarkContent(b *testing.B) {
	data := benchData()
	if testing.Short() {
		data = data[:4<<20]
	}
	codec, err := delta.NewCodec()
	if err != nil {
		b.Fatal(err)
	}
	defer codec.Close()
	chunks := func(fn func([]byte)) {
		delta.ChunkReader(bytes.NewReader(data), func(c []byte) error { fn(c); return nil })
	}
	b.Run("chunk", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			chunks(func([]byte) {})
		}
	})
	b.Run("hash-blake3", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			for o := 0; o < len(data); o += delta.ChunkAverage {
				delta.Hash(data[o : o+delta.ChunkAverage])
			}
		}
	})
	b.Run("hash-blake3-keyed", func(b *testing.B) {
		ids := delta.NewDataKey().IDs() // against hash-blake3: the cost of keyed IDs
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			for o := 0; o < len(data); o += delta.ChunkAverage {
				ids.Hash(data[o : o+delta.ChunkAverage])
			}
		}
	})
	b.Run("hash-sha256", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			for o := 0; o < len(data); o += delta.ChunkAverage {
				sha256.Sum256(data[o : o+delta.ChunkAverage])
			}
		}
	})
	b.Run("chunk+hash", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			chunks(func(c []byte) { delta.Hash(c) })
		}
	})
	b.Run("chunk+hash+compress", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		var buf []byte
		var stored int
		for b.Loop() {
			stored = 0
			chunks(func(c []byte) {
				delta.Hash(c)
				out, ok := codec.Compress(buf[:0], c)
				buf = out[:0]
				if ok {
					stored += len(out)
				} else {
					stored += len(c)
				}
			})
		}
		b.ReportMetric(float64(stored)/float64(len(data)), "stored/raw")
	})
}
