package overlay

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/benchenv"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// BenchmarkScaleCheckBase: a restore's check of a materialised base of
// 150,000 files (3,000 small) in 1,500 directories, answered from a clean
// watch (what a rollback or branch pays now), against the stat walk every
// check made before (the baseline, the same base, the same run), and the
// first check, which arms the watch and walks.
//
// Metrics: walk_ms, watched_ms, walk/watched, first_ms, load1 at the start
// and the end.
//
// Run: go test -tags turnsnaptest -run '^$' -bench ScaleCheckBase -benchtime 1x ./overlay/
func BenchmarkScaleCheckBase(b *testing.B) {
	testenv.RequireRoot(b)
	ctx := context.Background()
	files := benchenv.Size(150000, 3000)
	src := b.TempDir()
	for i := range files {
		p := filepath.Join(src, fmt.Sprintf("m%02d", i%15), fmt.Sprintf("d%03d", i%1500/15), fmt.Sprintf("f%06d.go", i))
		if i < 1500 {
			must(b, os.MkdirAll(filepath.Dir(p), 0o755))
		}
		must(b, os.WriteFile(p, fmt.Appendf(nil, "package p // %d\n", i), 0o644))
	}
	store := roottest.NewMemStore()
	res, err := fstree.Scan(ctx, src, fstree.ScanOptions{Saver: store, Quiescent: true})
	must(b, err)
	must(b, os.RemoveAll(src))
	bk := NewBackend(filepath.Join(b.TempDir(), "bases"))
	defer bk.Close()
	dst, err := bk.PrepareBase(ctx, res.Root, store)
	must(b, err)
	time.Sleep(fstree.RacyWindow) // the base's files out of the scan's racy window
	load0 := benchenv.Load1(b)
	var walk, watched, first time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		must(b, bk.checkBase(ctx, res.Root, dst, false))
		walk += time.Since(t0)
		bk.watches.closeAll()
		t0 = time.Now()
		ok, err := bk.CheckBase(ctx, res.Root, false)
		first += time.Since(t0)
		if !ok || err != nil {
			b.Fatalf("first check: %v %v", ok, err)
		}
		t0 = time.Now()
		ok, err = bk.CheckBase(ctx, res.Root, false)
		watched += time.Since(t0)
		if !ok || err != nil {
			b.Fatalf("watched check: %v %v", ok, err)
		}
	}
	b.StopTimer()
	if st := bk.BaseCheckStats(); st.Trusted != int64(b.N) {
		b.Fatalf("checks answered from the watch: %+v, want %d", st, b.N)
	}
	n := float64(b.N)
	b.ReportMetric(float64(walk.Microseconds())/1000/n, "walk_ms")
	b.ReportMetric(float64(watched.Microseconds())/1000/n, "watched_ms")
	b.ReportMetric(walk.Seconds()/watched.Seconds(), "walk/watched")
	b.ReportMetric(float64(first.Microseconds())/1000/n, "first_ms")
	b.ReportMetric(float64(files), "files")
	b.ReportMetric(load0, "load1_start")
	b.ReportMetric(benchenv.Load1(b), "load1_end")
}
