package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/benchenv"
	"golang.org/x/sys/unix"
)

// BenchmarkScaleRollbackBaseFile is issue 27's rollback of a base file
// (section 1), through the daemon (TrackChanges on, the API over a unix
// socket), on a base of 2,000 and of 150,000 files with a writable layer
// of 2,000 changed files. Each round edits, checkpoints, and rolls back
// once of each kind, in turn; only the rollback call is timed. In one run, each a median:
//   - base: undo an edit to README, a base file (written back through the
//     mounted root as a copy of the base's: fstree's diffbase.go); the
//     root must stay mounted (same mount ID);
//   - agent: undo an edit to one of the agent's files (absent from the
//     base), the path that was already mounted: the baseline;
//   - remount: undo the removal of a base directory, which still unmounts
//     and mounts the root (the mount ID must change).
//
// Reported: the three medians, base/agent and remount/base, the median
// time between the engine's rollback phases for base and remount, and
// the 1-minute load average at start and end. TURNSNAP_BENCH_SMALL shrinks the
// base to 300 files and the layer to 50.
func BenchmarkScaleRollbackBaseFile(b *testing.B) {
	sizes, changed, rounds := []int{2000, 150000}, 2000, 15
	if benchenv.Small() {
		sizes, changed, rounds = []int{300}, 50, 3
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("base=%d", n), func(b *testing.B) {
			for range b.N {
				benchRollbackBase(b, n, changed, rounds)
			}
		})
	}
}

func benchRollbackBase(b *testing.B, baseFiles, changed, rounds int) {
	ctx := context.Background()
	loadStart := benchenv.Load1(b)
	// The engine's rollback phases, timed from the call (the daemon runs
	// in this process): where a base file's rollback spends its time.
	var mu sync.Mutex
	var t0 time.Time
	var marks map[string]time.Duration
	hook := func(phase string) {
		mu.Lock()
		defer mu.Unlock()
		if marks != nil {
			marks[phase] = time.Since(t0)
		}
	}
	f := serve(b, hook, func(o *engine.Options) { o.TrackChanges = true })
	base := filepath.Join(filepath.Dir(f.base), "bigbase")
	for i := range baseFiles {
		dir := filepath.Join(base, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			must(b, os.MkdirAll(dir, 0o755))
		}
		must(b, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%06d.txt", i)), fmt.Appendf(nil, "base file %d\n", i), 0o644))
	}
	must(b, os.WriteFile(filepath.Join(base, "README"), []byte("the base's readme\n"), 0o644))
	r, err := f.c.CreateSandbox(ctx, api.CreateRequest{Name: "s", Base: base})
	must(b, err)
	root := r.Root
	for i := range changed {
		p := filepath.Join(root, "work", fmt.Sprintf("w%02d", i/100), fmt.Sprintf("f%05d.txt", i))
		if i%100 == 0 {
			must(b, os.MkdirAll(filepath.Dir(p), 0o755))
		}
		must(b, os.WriteFile(p, fmt.Appendf(nil, "the agent's file %d\n", i), 0o644))
	}
	// Two commits: the first makes the layer, the second gives the
	// tracker its base (the first turn of an engine walks).
	_, err = f.c.Checkpoint(ctx, "s", api.CheckpointRequest{})
	must(b, err)
	c1, err := f.c.Checkpoint(ctx, "s", api.CheckpointRequest{})
	must(b, err)
	f.e.WaitFreezes()
	phases := map[string][]time.Duration{}
	// One rollback of a kind; the kinds take turns round by round, so a
	// slow stretch of the shared machine lands on all three alike.
	times := map[string][]time.Duration{}
	measure := func(what string, edit func(round int), remounts bool, round int) {
		ds := times[what]
		{
			edit(round)
			if _, err := f.c.Checkpoint(ctx, "s", api.CheckpointRequest{}); err != nil {
				b.Fatalf("%s: checkpoint: %v", what, err)
			}
			f.e.WaitFreezes() // the checkpoint's background freeze is not the rollback's
			mnt := mountID(b, root)
			mu.Lock()
			t0, marks = time.Now(), map[string]time.Duration{}
			mu.Unlock()
			if _, err := f.c.Rollback(ctx, "s", api.RollbackRequest{Checkpoint: string(c1.ID)}); err != nil {
				b.Fatalf("%s: rollback: %v", what, err)
			}
			mu.Lock()
			d := time.Since(t0)
			ds = append(ds, d)
			// Each phase's share: from the one before it (in the order
			// reached) to it; "reply" is the rest, the receipt's check, the
			// intent's removal and the API's answer.
			prev := time.Duration(0)
			for _, p := range []string{"rollback: checked", "rollback: intent written", "rollback: layer-rewrite", "rollback: root switched", "rollback: head moved", "restore: receipt files"} {
				if at, ok := marks[p]; ok {
					phases[what+"/"+p] = append(phases[what+"/"+p], at-prev)
					prev = at
				}
			}
			phases[what+"/reply"] = append(phases[what+"/reply"], d-prev)
			marks = nil
			mu.Unlock()
			if again := mountID(b, root) != mnt; again != remounts {
				b.Fatalf("%s: the rollback remounted the root: %v, want %v", what, again, remounts)
			}
		}
		times[what] = ds
	}
	median := func(what string) time.Duration {
		ds := times[what]
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	readme := filepath.Join(root, "README")
	for round := range rounds {
		measure("base", func(round int) {
			must(b, os.WriteFile(readme, fmt.Appendf(nil, "edited in round %d\n", round), 0o644))
		}, false, round)
		measure("agent", func(round int) {
			must(b, os.WriteFile(filepath.Join(root, "work/w00/f00000.txt"), fmt.Appendf(nil, "edited in round %d\n", round), 0o644))
		}, false, round)
		measure("remount", func(int) { must(b, os.RemoveAll(filepath.Join(root, "d000"))) }, true, round)
	}
	if got, err := os.ReadFile(readme); err != nil || string(got) != "the base's readme\n" {
		b.Fatalf("README after the rollbacks: %q, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(root, "d000/f000000.txt")); err != nil {
		b.Fatalf("the base directory after the rollbacks: %v", err)
	}
	baseFile, agent, remount := median("base"), median("agent"), median("remount")
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(baseFile), "base_file_ms")
	b.ReportMetric(ms(agent), "agent_file_ms")
	b.ReportMetric(ms(remount), "remount_ms")
	b.ReportMetric(float64(baseFile)/float64(agent), "x_base_vs_agent")
	b.ReportMetric(float64(remount)/float64(baseFile), "x_remount_vs_base")
	for _, p := range []struct{ phase, unit string }{
		{"rollback: checked", "checks"}, {"rollback: intent written", "live_scan_plan_intent"}, {"rollback: layer-rewrite", "first_write"},
		{"rollback: root switched", "apply_verify_sync"}, {"rollback: head moved", "head"},
		{"restore: receipt files", "to_receipt"}, {"reply", "receipt_reply"},
	} {
		for _, what := range []string{"base", "remount"} {
			if d := phases[what+"/"+p.phase]; len(d) > 0 {
				slices.Sort(d)
				b.ReportMetric(ms(d[len(d)/2]), what+"_"+p.unit+"_ms")
			}
		}
	}
	b.ReportMetric(loadStart, "load1_start")
	b.ReportMetric(benchenv.Load1(b), "load1_end")
}

// mountID is the unique ID of the mount whose root p is (a plain mount
// ID is reused once its mount is gone).
func mountID(tb testing.TB, p string) uint64 {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID_UNIQUE, &stx); err != nil || stx.Mask&unix.STATX_MNT_ID_UNIQUE == 0 {
		tb.Fatalf("statx %s: no unique mount id: %v", p, err)
	}
	return stx.Mnt_id
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}
