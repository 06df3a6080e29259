package btrfs

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/btrfstest"
	"github.com/turnsnap/turnsnap/internal/roottest"
)

// BenchmarkScanScaling times the scan of a turn (Scan, then Committed)
// on bases of two sizes, ten times apart: the cost of a 10-file turn and of
// an unchanged one should not depend on the size of the tree. entries/op
// is what the scan looked at. TURNSNAP_BENCH_SMALL shrinks the bases.
func BenchmarkScanScaling(b *testing.B) {
	sizes := []int{5000, 50000}
	if os.Getenv("TURNSNAP_BENCH_SMALL") != "" {
		sizes = []int{500, 5000}
	}
	pool := btrfstest.Pool(b)
	be, err := NewBackend(Options{Pool: pool})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, n := range sizes {
		store := roottest.NewMemStore()
		rng := rand.New(rand.NewSource(int64(n)))
		base := b.TempDir()
		path := func(root string, i int) string {
			return filepath.Join(root, fmt.Sprintf("d%03d/s%d/f%05d", i/800, (i/200)%4, i))
		}
		body := make([]byte, 2048)
		for i := range n {
			if i%200 == 0 {
				must(b, os.MkdirAll(filepath.Dir(path(base, i)), 0o755))
			}
			rng.Read(body)
			must(b, os.WriteFile(path(base, i), body, 0o644))
		}
		res, err := fstree.Scan(ctx, base, fstree.ScanOptions{Saver: store})
		must(b, err)
		lower, err := be.PrepareBase(ctx, res.Root, store)
		must(b, err)
		r, err := be.CreateRoot(ctx, filepath.Join(b.TempDir(), "sb"), lower, delta.EmptyTree(), store)
		must(b, err)
		b.Cleanup(func() { r.Remove(context.Background()) })
		edit := 0
		b.Run(fmt.Sprintf("base=%d/10-files", n), func(b *testing.B) {
			var entries int64
			for b.Loop() {
				b.StopTimer()
				for range 10 {
					edit++
					rng.Read(body)
					must(b, os.WriteFile(path(r.Path(), (edit*7919)%n), body, 0o644))
				}
				b.StartTimer()
				res, err := r.Scan(ctx, store)
				must(b, err)
				must(b, r.Committed(res))
				entries += res.Stats.Entries
			}
			b.ReportMetric(float64(entries)/float64(b.N), "entries/op")
		})
		b.Run(fmt.Sprintf("base=%d/noop", n), func(b *testing.B) {
			for b.Loop() {
				res, err := r.Scan(ctx, store)
				must(b, err)
				if res.Stats.Entries != 0 {
					b.Fatalf("unchanged scan looked at %d entries", res.Stats.Entries)
				}
			}
		})
	}
}
