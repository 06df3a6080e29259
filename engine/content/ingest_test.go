package content

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/upload"
)

// newRepoTB is newRepo for tests and benchmarks alike.
func newRepoTB(tb testing.TB) *Repo {
	tb.Helper()
	ctx := context.Background()
	store, err := upload.NewLocal(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	cat, err := catalog.Open(ctx, tb.TempDir(), catalog.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cat.Close() })
	codec, err := delta.NewCodec()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(codec.Close)
	return New(store, cat, codec, nil)
}

// writeIngestData writes randomBytes of random files and textBytes of
// source-like text files below dir, deterministically (seed), spread over
// directories of 20 files. Random files are fileSize bytes, text files a
// tenth of that. It returns the bytes written.
func writeIngestData(tb testing.TB, dir string, seed uint64, randomBytes, textBytes, fileSize int64) int64 {
	tb.Helper()
	rng := rand.New(rand.NewPCG(seed, seed))
	var total int64
	n := 0
	write := func(size int64, fill func([]byte)) {
		d := filepath.Join(dir, fmt.Sprintf("pkg%03d", n/20))
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatal(err)
		}
		data := make([]byte, size)
		fill(data)
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d", n)), data, 0o644); err != nil {
			tb.Fatal(err)
		}
		n++
		total += size
	}
	for left := randomBytes; left > 0; left -= fileSize {
		write(min(left, fileSize), func(b []byte) {
			for i := 0; i+8 <= len(b); i += 8 {
				v := rng.Uint64()
				for k := range 8 {
					b[i+k] = byte(v >> (8 * k))
				}
			}
		})
	}
	for left := textBytes; left > 0; left -= fileSize / 10 {
		write(min(left, fileSize/10), func(b []byte) { sourceLike(rng, b) })
	}
	return total
}

// sourceLike fills b with text that compresses about as well as code:
// keywords, identifiers from a vocabulary, numbers, indentation.
func sourceLike(rng *rand.Rand, b []byte) {
	words := []string{"func", "return", "err", "nil", "ctx", "if", "for", "range", "{", "}", ":=", "string",
		"int", "//", "type", "struct", "package", "import", "var", "const", "(", ")", "[]byte", "len", "make"}
	i := 0
	for i < len(b) {
		switch r := rng.IntN(20); {
		case r == 0:
			i += copy(b[i:], "\n\t")
		case r == 1:
			i += copy(b[i:], fmt.Sprint(rng.IntN(100000)))
		case r < 5:
			i += copy(b[i:], fmt.Sprintf("name%d", rng.IntN(2000)))
		default:
			i += copy(b[i:], words[rng.IntN(len(words))])
		}
		if i < len(b) {
			b[i] = ' '
			i++
		}
	}
}

// ingest scans dir into a fresh Op of r with the given pipeline workers
// and publishes it.
func ingest(tb testing.TB, r *Repo, dir string, workers int) (*fstree.ScanResult, *Op) {
	tb.Helper()
	ctx := context.Background()
	op := r.Begin()
	res, err := fstree.Scan(ctx, dir, fstree.ScanOptions{Saver: op, Workers: workers})
	if err != nil {
		tb.Fatal(err)
	}
	if err := op.Publish(ctx, res.Root); err != nil {
		tb.Fatal(err)
	}
	return res, op
}

// TestPipelinePacksMatchSingleWorker: the packs a pipelined scan writes
// (named by the hash of their bytes) are exactly those of a single-worker
// scan, in the same order, with the same trees and stats.
func TestPipelinePacksMatchSingleWorker(t *testing.T) {
	dir := t.TempDir()
	writeIngestData(t, dir, 7, 24<<20, 12<<20, 2<<20)
	var packs [][]upload.ObjectInfo
	var roots []delta.ID
	for _, workers := range []int{1, 4} {
		res, op := ingest(t, newRepoTB(t), dir, workers)
		roots = append(roots, res.Root)
		packs = append(packs, op.Written())
	}
	if roots[0] != roots[1] {
		t.Fatalf("roots differ: %s vs %s", roots[0].Short(), roots[1].Short())
	}
	if len(packs[0]) < 3 || !slices.Equal(packs[0], packs[1]) {
		t.Fatalf("packs differ:\n single %v\n pipeline %v", packs[0], packs[1])
	}
}
