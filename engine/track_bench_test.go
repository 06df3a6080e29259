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
)

// BenchmarkTrackedTurns compares, on one sandbox of the benchmark shape
// (20,000 base files, 2,000 changed files in the layer; smaller under
// TURNSNAP_BENCH_SMALL), turns decided by the change tracker against the
// same turns by the incremental walk, in the same run: an unchanged turn
// (goal: median <= 1 ms tracked) and a turn of 10 changed files (goal:
// <= 10 ms). Each reports its median in ms; the walk-* runs are the
// baselines the tracked-* runs are ratios against.
func BenchmarkTrackedTurns(b *testing.B) {
	ctx := context.Background()
	e, root, _ := benchSandbox(b)
	rng := rand.New(rand.NewSource(3))
	i := 0
	turn := func(b *testing.B, files int, want delta.Class) time.Duration {
		b.StopTimer()
		for range files {
			p := filepath.Join(root, fmt.Sprintf("new%02d/n%05d.txt", 0, 2*(i%100)+1))
			must(b, os.WriteFile(p, fileBody(rng, 2048), 0o644))
			i++
		}
		b.StartTimer()
		start := time.Now()
		r, err := e.Checkpoint(ctx, "bench", CheckpointOptions{})
		d := time.Since(start)
		must(b, err)
		if r.Class != want {
			b.Fatalf("turn of %d files classed %s", files, r.Class)
		}
		return d
	}
	// The phases of each turn: start to scan done, to commit start, to end.
	var marks []time.Time
	e.opts.AtPhase = func(p string) {
		if p == PhaseScan || p == PhaseCommit {
			marks = append(marks, time.Now())
		}
	}
	run := func(name string, files int, want delta.Class) {
		b.Run(name, func(b *testing.B) {
			var ds, scans, commits []time.Duration
			for b.Loop() {
				marks = marks[:0]
				start := time.Now()
				ds = append(ds, turn(b, files, want))
				if len(marks) > 0 {
					scans = append(scans, marks[0].Sub(start))
				}
				if len(marks) > 1 {
					commits = append(commits, start.Add(ds[len(ds)-1]).Sub(marks[1]))
				}
			}
			median := func(ds []time.Duration) float64 {
				if len(ds) == 0 {
					return 0
				}
				slices.Sort(ds)
				return float64(ds[len(ds)/2].Nanoseconds()) / 1e6
			}
			b.ReportMetric(median(ds), "median-ms")
			b.ReportMetric(median(scans), "scan-median-ms")
			b.ReportMetric(median(commits), "commit-median-ms")
		})
	}
	overlayOf(e).SetTracking(false, e.log)
	run("walk-unchanged", 0, delta.ClassSkip)
	run("walk-10-files", 10, delta.ClassFS)
	overlayOf(e).SetTracking(true, e.log)
	_, err := e.Checkpoint(ctx, "bench", CheckpointOptions{}) // the tracker's first turn walks
	must(b, err)
	settle()
	run("tracked-unchanged", 0, delta.ClassSkip)
	run("tracked-10-files", 10, delta.ClassFS)
	if st := e.TrackingStats(); st.TrackedScans == 0 {
		b.Fatalf("no turn was tracked: %+v", st)
	}
}
