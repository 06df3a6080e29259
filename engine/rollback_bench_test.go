package engine

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/benchenv"
	"github.com/turnsnap/turnsnap/internal/btrfstest"
	"github.com/turnsnap/turnsnap/overlay"
)

// rollbackBenchShape is the layer: 2,000 files of 10 KB (20 MB) in
// directories of 200, on a small base. TURNSNAP_BENCH_SMALL shrinks it.
func rollbackBenchShape() (files, size int) {
	if benchenv.Small() {
		return 200, 4 << 10
	}
	return 2000, 10 << 10
}

// BenchmarkRollbackByDiff rolls a sandbox whose writable layer holds 2,000
// files (20 MB) back and forth between two checkpoints 4 files apart (2
// rewritten, 1 added, 1 deleted), in one run:
//
//   - overlay/by-diff/tracked: the daemon's path (Options.TrackChanges):
//     the live state comes from the change tracker's record, so only the
//     directories on the way to the 4 names are looked at, and only the 4
//     names are written (files in both states keep their inodes), through
//     the mounted root (none of them is in the base), which stays mounted
//     with its tracker.
//   - overlay/by-diff/walk: the same without tracking (the CLI): the live
//     layer is walked, one stat per entry.
//   - overlay/materialise: the whole layer rebuilt beside the live one
//     (TURNSNAP_OVERLAY_RESTORE=rebuild, the path before the diff).
//   - overlay/cp-a: `cp -a` of the upper directory, the floor of any copy.
//   - btrfs/snapshot: a snapshot of the restore point.
//
// It logs tracked's median rollback as ratios against the others' medians.
func BenchmarkRollbackByDiff(b *testing.B) {
	ctx := context.Background()
	nFiles, size := rollbackBenchShape()
	base := benchBase(b, 100)
	pool := btrfstest.Pool(b)
	e := newEngine(b)
	te := openTracking(b, filepath.Join(b.TempDir(), "home"))
	rng := rand.New(rand.NewSource(5))
	targets := map[string][2]string{}
	engines := map[string]*Engine{}
	for _, s := range []struct {
		name string
		e    *Engine
		opts CreateOptions
	}{{"overlay", e, CreateOptions{Base: base}}, {"tracked", te, CreateOptions{Base: base}}, {"btrfs", e, btrfsOpts(pool, base)}} {
		e := s.e
		engines[s.name] = e
		cr, err := e.CreateSandbox(ctx, delta.SandboxName(s.name), s.opts)
		must(b, err)
		for i := range nFiles {
			p := filepath.Join(cr.Root, fmt.Sprintf("work%02d/f%05d.txt", i/200, i))
			must(b, os.MkdirAll(filepath.Dir(p), 0o755))
			must(b, os.WriteFile(p, fileBody(rng, size), 0o644))
		}
		settle()
		c1, err := e.Checkpoint(ctx, delta.SandboxName(s.name), CheckpointOptions{})
		must(b, err)
		for _, i := range []int{3, nFiles / 2} {
			rewrite(b, filepath.Join(cr.Root, fmt.Sprintf("work%02d/f%05d.txt", i/200, i)), string(fileBody(rng, size)))
		}
		must(b, os.WriteFile(filepath.Join(cr.Root, "work00/added.txt"), fileBody(rng, size), 0o644))
		must(b, os.Remove(filepath.Join(cr.Root, fmt.Sprintf("work%02d/f%05d.txt", (nFiles-1)/200, nFiles-1))))
		settle()
		c2, err := e.Checkpoint(ctx, delta.SandboxName(s.name), CheckpointOptions{})
		must(b, err)
		targets[s.name] = [2]string{c1.ID.String(), c2.ID.String()}
	}
	// The checkpoints' layers are frozen in the background (overlay/frozen):
	// their writes must not land in the first sub-benchmark.
	e.WaitFreezes()
	te.WaitFreezes()
	// The median of each sub-benchmark's rollbacks is reported too
	// (p50-ns): on a shared machine one stalled fsync moves the mean.
	perOp := map[string]time.Duration{}
	median := func(b *testing.B, ds []time.Duration) {
		if len(ds) == 0 {
			return
		}
		slices.Sort(ds)
		perOp[b.Name()] = ds[len(ds)/2]
		b.ReportMetric(float64(ds[len(ds)/2].Nanoseconds()), "p50-ns")
	}
	roll := func(b *testing.B, name, live string) {
		alt, e := targets[name], engines[name]
		var ds []time.Duration
		for b.Loop() {
			t := time.Now()
			res, err := e.Rollback(ctx, delta.SandboxName(name), mustRef(alt[len(ds)%2]), RollbackOptions{})
			if err != nil {
				b.Fatal(err)
			}
			ds = append(ds, time.Since(t))
			if live != "" && res.LiveScan != live {
				b.Fatalf("rollback %d found the live state by %q, want %q", len(ds), res.LiveScan, live)
			}
			// The 4 names are the agent's (the base lacks them): the diff
			// is written through the mounted root.
			if live != "" && name != "btrfs" && !res.Mounted {
				b.Fatalf("rollback %d unmounted the root", len(ds))
			}
		}
		if len(ds)%2 == 1 { // back to the newest for the next sub-benchmark
			_, err := e.Rollback(ctx, delta.SandboxName(name), mustRef(alt[1]), RollbackOptions{})
			must(b, err)
		}
		median(b, ds)
	}
	byDiff := func(name, live string) func(b *testing.B) {
		return func(b *testing.B) {
			// The file rewritten between the checkpoints keeps its inode:
			// the diff path ran, not the rebuild.
			p := filepath.Join(engines[name].home.sandboxDir(delta.SandboxName(name)), "root", "work00/f00003.txt")
			before := inode(b, p)
			roll(b, name, live)
			if inode(b, p) != before {
				b.Fatal("the by-diff rollback rebuilt the layer (new inodes)")
			}
		}
	}
	b.Run("overlay/by-diff/tracked", byDiff("tracked", overlay.LiveTracked))
	b.Run("overlay/by-diff/walk", byDiff("overlay", "walk"))
	b.Run("overlay/materialise", func(b *testing.B) {
		ob := overlayOf(engines["overlay"])
		ob.SetRebuildRestores(true)
		defer ob.SetRebuildRestores(false)
		roll(b, "overlay", "")
	})
	b.Run("overlay/cp-a", func(b *testing.B) {
		gen, err := os.Readlink(filepath.Join(e.home.sandboxDir("overlay"), "current"))
		must(b, err)
		upper := filepath.Join(e.home.sandboxDir("overlay"), gen, "upper")
		dst := filepath.Join(b.TempDir(), "copy")
		var ds []time.Duration
		for b.Loop() {
			t := time.Now()
			if out, err := exec.Command("cp", "-a", upper, dst).CombinedOutput(); err != nil {
				b.Fatalf("cp -a: %v: %s", err, out)
			}
			ds = append(ds, time.Since(t))
			b.StopTimer()
			must(b, os.RemoveAll(dst))
			b.StartTimer()
		}
		median(b, ds)
	})
	b.Run("btrfs/snapshot", func(b *testing.B) { roll(b, "btrfs", "") })
	tracked := perOp[b.Name()+"/overlay/by-diff/tracked"]
	for _, other := range []string{"overlay/by-diff/walk", "overlay/materialise", "overlay/cp-a", "btrfs/snapshot"} {
		if d := perOp[b.Name()+"/"+other]; d > 0 && tracked > 0 {
			b.Logf("by-diff/tracked median %v: %.2fx faster than %s (median %v)", tracked, float64(d)/float64(tracked), other, d)
		}
	}
}
