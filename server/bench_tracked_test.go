package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
)

// BenchmarkTrackedTurnsThroughAPI is issue 11's latency benchmark, one run:
// one sandbox on a base of 20,000 files whose writable layer holds 2,000
// changed files, served as the daemon serves it (TrackChanges on, one
// engine, the API over a unix socket). Reported, each a median:
//   - an unchanged turn through the API, tracked (no walk);
//   - the same turn through the API of an untracked engine (the walk);
//   - the same turn the way a CLI process does it (open the home, walk,
//     close; in-process, so without process start-up);
//   - a 10-file turn through the API, tracked, and untracked.
func BenchmarkTrackedTurnsThroughAPI(b *testing.B) {
	baseFiles, changed, turns := 20000, 2000, 15
	if os.Getenv("TURNSNAP_BENCH_SMALL") != "" {
		baseFiles, changed, turns = 500, 50, 3
	}
	ctx := context.Background()
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	for range b.N {
		tracked := serve(b, nil, func(o *engine.Options) { o.TrackChanges = true })
		walked := serve(b, nil)
		// One base for both, in tracked's fixture dir.
		base := filepath.Join(filepath.Dir(tracked.base), "bigbase")
		for i := range baseFiles {
			dir := filepath.Join(base, fmt.Sprintf("d%03d", i/100))
			os.MkdirAll(dir, 0o755)
			os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d.txt", i)), fmt.Appendf(nil, "base file %d\n", i), 0o644)
		}
		setup := func(f *fixture) string {
			r, err := f.c.CreateSandbox(ctx, api.CreateRequest{Name: "s", Base: base})
			if err != nil {
				b.Fatal(err)
			}
			for i := range changed {
				p := filepath.Join(r.Root, fmt.Sprintf("d%03d", i/100), fmt.Sprintf("f%05d.txt", i))
				os.WriteFile(p, fmt.Appendf(nil, "changed %d\n", i), 0o644)
			}
			// Two commits: the first makes the layer, the second gives the
			// tracker its base (the first turn of an engine walks).
			for range 2 {
				if _, err := f.c.Checkpoint(ctx, "s", api.CheckpointRequest{}); err != nil {
					b.Fatal(err)
				}
				editTurn(b, r.Root, 0, 1)
			}
			if _, err := f.c.Checkpoint(ctx, "s", api.CheckpointRequest{}); err != nil {
				b.Fatal(err)
			}
			return r.Root
		}
		troot, wroot := setup(tracked), setup(walked)
		// The set-up's first layer (2,000 copied files) is frozen in the
		// background, one per fixture: two daemons' worth in one process,
		// which a host never runs, each taking a core past its 2 s defer
		// bound. The turns measured below are steady-state ones, each with
		// its own background freeze.
		tracked.e.WaitFreezes()
		walked.e.WaitFreezes()
		skips := func(f *fixture) []time.Duration {
			var d []time.Duration
			for range turns {
				t0 := time.Now()
				r, err := f.c.Checkpoint(ctx, "s", api.CheckpointRequest{})
				if err != nil || r.Class != "skip" {
					b.Fatalf("unchanged turn: %+v %v", r, err)
				}
				d = append(d, time.Since(t0))
			}
			return d
		}
		tenFiles := func(f *fixture, root string) []time.Duration {
			var d []time.Duration
			for turn := range turns {
				editTurn(b, root, 100+turn, 10)
				t0 := time.Now()
				r, err := f.c.Checkpoint(ctx, "s", api.CheckpointRequest{})
				if err != nil || r.Class != "fs" {
					b.Fatalf("10-file turn: %+v %v", r, err)
				}
				d = append(d, time.Since(t0))
			}
			return d
		}
		trackedSkip, walkedSkip := skips(tracked), skips(walked)
		trackedTen, walkedTen := tenFiles(tracked, troot), tenFiles(walked, wroot)
		// The CLI's way: a process per turn opens the home and walks. The
		// walked fixture's engine holds that home, so the CLI path gets a
		// home of its own with the same sandbox.
		home := filepath.Join(b.TempDir(), "cli-home")
		e, err := engine.Open(ctx, engine.Options{Home: home})
		if err != nil {
			b.Fatal(err)
		}
		cr, err := e.CreateSandbox(ctx, "s", engine.CreateOptions{Base: base})
		if err != nil {
			b.Fatal(err)
		}
		for i := range changed {
			os.WriteFile(filepath.Join(cr.Root, fmt.Sprintf("d%03d", i/100), fmt.Sprintf("f%05d.txt", i)), fmt.Appendf(nil, "changed %d\n", i), 0o644)
		}
		if _, err := e.Checkpoint(ctx, "s", engine.CheckpointOptions{}); err != nil {
			b.Fatal(err)
		}
		e.Close()
		b.Cleanup(func() {
			if e, err := engine.Open(ctx, engine.Options{Home: home, LockWait: time.Minute}); err == nil {
				e.RemoveSandbox(ctx, "s")
				e.Close()
			}
		})
		var cli []time.Duration
		for range turns {
			t0 := time.Now()
			e, err := engine.Open(ctx, engine.Options{Home: home, LockWait: time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			r, err := e.Checkpoint(ctx, "s", engine.CheckpointOptions{})
			e.Close()
			if err != nil || r.Class != delta.ClassSkip {
				b.Fatalf("CLI-path unchanged turn: %+v %v", r, err)
			}
			cli = append(cli, time.Since(t0))
		}
		ts, ws, cs := median(trackedSkip), median(walkedSkip), median(cli)
		b.ReportMetric(ts, "skip_api_tracked_ms")
		b.ReportMetric(ws, "skip_api_walk_ms")
		b.ReportMetric(cs, "skip_cli_path_ms")
		b.ReportMetric(ws/ts, "x_walk_vs_tracked")
		b.ReportMetric(cs/ts, "x_cli_vs_tracked")
		b.ReportMetric(median(trackedTen), "ten_files_api_tracked_ms")
		b.ReportMetric(median(walkedTen), "ten_files_api_walk_ms")
	}
}
