package engine

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/receipt"
	"github.com/turnsnap/turnsnap/internal/btrfstest"
)

// BenchmarkRollbackReceipt measures what the receipt adds to a rollback
// of a 2,000-file layer (the shape of BenchmarkRollbackByDiff: 2,000 files
// of 10 KB, two checkpoints 4 files apart), with and without the receipt
// in the same run: each iteration rolls back once with it and once
// without (receipt.Options.Unchecked), which first alternating, so both see the
// same machine and the same targets. It reports each one's median rollback and their ratio
// (receipt-ratio, the goal is under 1.10), and the median of the
// receipt's own check (Receipt.Check) as a share of the rollback.
//
//   - overlay/walk: the CLI's path (no change tracker).
//   - overlay/tracked: the daemon's (Options.TrackChanges).
//   - btrfs: a restore point's snapshot.
func BenchmarkRollbackReceipt(b *testing.B) {
	ctx := context.Background()
	nFiles, size := rollbackBenchShape()
	base := benchBase(b, 100)
	pool := btrfstest.Pool(b)
	e := newEngine(b)
	te := openTracking(b, filepath.Join(b.TempDir(), "home"))
	rng := rand.New(rand.NewSource(7))
	for _, s := range []struct {
		bench string
		e     *Engine
		opts  CreateOptions
	}{{"overlay/walk", e, CreateOptions{Base: base}}, {"overlay/tracked", te, CreateOptions{Base: base}}, {"btrfs", e, btrfsOpts(pool, base)}} {
		e, name := s.e, fmt.Sprintf("s%d", rng.Intn(1<<30))
		cr, err := e.CreateSandbox(ctx, delta.SandboxName(name), s.opts)
		must(b, err)
		for i := range nFiles {
			p := filepath.Join(cr.Root, fmt.Sprintf("work%02d/f%05d.txt", i/200, i))
			must(b, os.MkdirAll(filepath.Dir(p), 0o755))
			must(b, os.WriteFile(p, fileBody(rng, size), 0o644))
		}
		settle()
		c1, err := e.Checkpoint(ctx, delta.SandboxName(name), CheckpointOptions{})
		must(b, err)
		for _, i := range []int{3, nFiles / 2} {
			rewrite(b, filepath.Join(cr.Root, fmt.Sprintf("work%02d/f%05d.txt", i/200, i)), string(fileBody(rng, size)))
		}
		must(b, os.WriteFile(filepath.Join(cr.Root, "work00/added.txt"), fileBody(rng, size), 0o644))
		must(b, os.Remove(filepath.Join(cr.Root, fmt.Sprintf("work%02d/f%05d.txt", (nFiles-1)/200, nFiles-1))))
		settle()
		c2, err := e.Checkpoint(ctx, delta.SandboxName(name), CheckpointOptions{})
		must(b, err)
		e.WaitFreezes()
		targets := [2]string{c1.ID.String(), c2.ID.String()}
		b.Run(s.bench, func(b *testing.B) {
			var with, without, check []time.Duration
			n := 0
			roll := func(off bool) time.Duration {
				e.receipts = newReceipts(e, receipt.Options{Unchecked: off})
				defer func() { e.receipts = newReceipts(e, receipt.Options{}) }()
				t := time.Now()
				r, err := e.Rollback(ctx, delta.SandboxName(name), mustRef(targets[n%2]), RollbackOptions{})
				d := time.Since(t)
				n++
				if err != nil {
					b.Fatal(err)
				}
				if !off {
					if !r.Receipt.OK {
						b.Fatalf("receipt %+v", r.Receipt)
					}
					check = append(check, r.Receipt.Check)
				}
				return d
			}
			// Which goes first alternates, so each sees both targets
			// (rolling to c1 and to c2 differ) equally often.
			for i := 0; b.Loop(); i++ {
				if i%2 == 0 {
					with = append(with, roll(false))
					without = append(without, roll(true))
				} else {
					without = append(without, roll(true))
					with = append(with, roll(false))
				}
			}
			med := func(ds []time.Duration) time.Duration { slices.Sort(ds); return ds[len(ds)/2] }
			mw, mo, mc := med(with), med(without), med(check)
			b.ReportMetric(float64(mw.Nanoseconds()), "with-p50-ns")
			b.ReportMetric(float64(mo.Nanoseconds()), "without-p50-ns")
			b.ReportMetric(float64(mw)/float64(mo), "receipt-ratio")
			b.ReportMetric(float64(mc)/float64(mw), "check-share")
			b.Logf("%s: rollback with receipt %v, without %v (x%.3f); the receipt's check %v", s.bench, mw, mo, float64(mw)/float64(mo), mc)
		})
	}
}
