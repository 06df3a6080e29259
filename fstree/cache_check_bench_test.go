package fstree

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// BenchmarkBaseCheck checks an untouched 20,000-file base (2,000 under
// TURNSNAP_BENCH_SMALL) against its cache, as a restore's base check
// does: "scan" is a Scan with the cache as Prev (the check before
// Unchanged: every tree built, encoded and hashed, a new cache made), the
// baseline; "unchanged" is ScanCache.Unchanged. It logs the ratio of
// their medians.
func BenchmarkBaseCheck(b *testing.B) {
	n := 20000
	if os.Getenv("TURNSNAP_BENCH_SMALL") != "" {
		n = 2000
	}
	ctx := context.Background()
	dir := b.TempDir()
	old := time.Now().Add(-time.Hour)
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("usr/d%02d/s%02d/f%05d", i%20, i/20%10, i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(p), 0o644); err != nil {
			b.Fatal(err)
		}
		if err := os.Chtimes(p, old, old); err != nil {
			b.Fatal(err)
		}
	}
	res, err := Scan(ctx, dir, ScanOptions{Quiescent: true})
	if err != nil {
		b.Fatal(err)
	}
	p50 := map[string]time.Duration{}
	for _, bc := range []struct {
		name  string
		check func() bool
	}{
		{"scan", func() bool {
			r, err := Scan(ctx, dir, ScanOptions{Quiescent: true, Prev: res.Cache})
			return err == nil && r.Root == res.Root
		}},
		{"unchanged", func() bool { return res.Cache.Unchanged(ctx, dir) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var ds []time.Duration
			for b.Loop() {
				t := time.Now()
				if !bc.check() {
					b.Fatal("the untouched base does not check")
				}
				ds = append(ds, time.Since(t))
			}
			slices.Sort(ds)
			p50[bc.name] = ds[len(ds)/2]
			b.ReportMetric(float64(ds[len(ds)/2].Nanoseconds()), "p50-ns")
		})
	}
	if p50["unchanged"] > 0 {
		b.Logf("%d files: unchanged %v, scan %v: %.2fx faster", n, p50["unchanged"], p50["scan"], float64(p50["scan"])/float64(p50["unchanged"]))
	}
}
