package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/benchenv"
)

// Issue 27, section 4, first half: a long history. One home holds n
// checkpoints across 100 sandboxes (a tree of branches: sandbox i is
// branched from the middle of sandbox (i-1)/2's line), each made by a real
// turn through the engine's commit path (write a file, Checkpoint). The
// history commands then run as the CLI runs them, in this process (the
// cobra command tree of main, the home opened directly, the text
// renderers writing to a buffer): a real daemon's /metrics on the home,
// `log` of one sandbox, `log --all
// --graph`, `catalog rebuild` (from the store alone), `forget --all` with
// a policy, and `gc`; and the catalog's size on disk is read. Each is
// measured at two sizes in the same run (1,000 and 10,000; small: 100 and
// 1,000) and reported with its growth; "x-linear" is that growth divided
// by the growth of the history (1 = linear, below 1 = better). The
// baseline is the mean time of one turn while the history was built.

// historyOps are the measured commands, in the order they run on a home
// (forget changes the history, gc reclaims what it dropped).
var historyOps = []string{"metrics", "log", "log-all-graph", "rebuild", "forget", "gc"}

// historyRun is what one size measured.
type historyRun struct {
	n       int // checkpoints made by turns
	turn    time.Duration
	op      map[string]time.Duration
	catalog int64 // bytes on disk (allocated blocks)
}

func BenchmarkScaleHistory(b *testing.B) {
	sandboxes := benchenv.Size(100, 20)
	sizes := []int{benchenv.Size(1000, 100), benchenv.Size(10000, 1000)}
	for range b.N {
		loadStart := benchenv.Load1(b)
		runs := make([]historyRun, len(sizes))
		for i, n := range sizes {
			runs[i] = measureHistory(b, n, sandboxes)
		}
		small, big := runs[0], runs[1]
		grow := float64(big.n) / float64(small.n)
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		for _, op := range historyOps {
			b.ReportMetric(ms(small.op[op]), fmt.Sprintf("%s-ms@%d", op, small.n))
			b.ReportMetric(ms(big.op[op]), fmt.Sprintf("%s-ms@%d", op, big.n))
			g := float64(big.op[op]) / float64(small.op[op])
			b.ReportMetric(g/grow, op+"-x-linear")
			b.ReportMetric(float64(big.op[op])/float64(big.n)/float64(big.turn), op+"-per-checkpoint-x-turn")
		}
		b.ReportMetric(float64(small.catalog)/(1<<20), fmt.Sprintf("catalog-MiB@%d", small.n))
		b.ReportMetric(float64(big.catalog)/(1<<20), fmt.Sprintf("catalog-MiB@%d", big.n))
		b.ReportMetric(float64(big.catalog)/float64(small.catalog)/grow, "catalog-x-linear")
		b.ReportMetric(float64(big.catalog)/float64(big.n), "catalog-B/checkpoint")
		b.ReportMetric(ms(small.turn), fmt.Sprintf("turn-baseline-ms@%d", small.n))
		b.ReportMetric(ms(big.turn), fmt.Sprintf("turn-baseline-ms@%d", big.n))
		b.ReportMetric(loadStart, "load1-start")
		b.ReportMetric(benchenv.Load1(b), "load1-end")
	}
}

// measureHistory builds a home of n turns over sandboxes sandboxes and
// runs the history commands on it.
func measureHistory(b *testing.B, n, sandboxes int) historyRun {
	b.Helper()
	ctx := context.Background()
	dir := b.TempDir()
	home, base := filepath.Join(dir, "home"), filepath.Join(dir, "base")
	must(b, os.MkdirAll(filepath.Join(base, "src"), 0o755))
	must(b, os.WriteFile(filepath.Join(base, "src", "main.go"), []byte("package main\n"), 0o644))
	run := historyRun{n: n, op: map[string]time.Duration{}}
	run.turn = buildHistory(b, home, base, n, sandboxes)
	defer removeAll(b, home, sandboxes)
	total := n + 1 // s00's turn 0 (a branch starts at its origin, no new checkpoint)
	last := fmt.Sprintf("s%02d", sandboxes-1)

	// A daemon on the home answers /metrics (the median of 5 scrapes):
	// Prometheus scrapes it all day, whatever the history's length.
	d := startDaemon(b, home, nil)
	c := d.client(b)
	var scrapes []time.Duration
	for range 5 {
		start := time.Now()
		m, err := c.Metrics(ctx)
		scrapes = append(scrapes, time.Since(start))
		must(b, err)
		if !strings.Contains(m, "turnsnap_upload_queue_depth") {
			b.Fatalf("/metrics has no turnsnap_upload_queue_depth:\n%s", m)
		}
	}
	run.op["metrics"] = median(scrapes)
	if code := d.stop(b); code != 0 {
		b.Fatalf("turnsnap serve exited %d", code)
	}

	timed := func(op string, args ...string) string {
		start := time.Now()
		out, err := runInProcess(ctx, home, args...)
		run.op[op] = time.Since(start)
		if err != nil {
			b.Fatalf("turnsnap %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	// log of the deepest sandbox: its own turns and its ancestors' up the
	// branch tree.
	out := timed("log", "log", last)
	if lines := strings.Count(out, "\n"); lines <= n/sandboxes {
		b.Fatalf("log %s printed %d lines, want more than its %d turns", last, lines, n/sandboxes)
	}
	out = timed("log-all-graph", "log", "--all", "--graph")
	if rows := strings.Count(out, "* "); rows != total {
		b.Fatalf("log --all --graph drew %d checkpoints, want %d", rows, total)
	}
	run.catalog = diskUsage(b, filepath.Join(home, "catalog"))

	var rb api.Rebuilt
	decode(b, timed("rebuild", "--json", "catalog", "rebuild"), &rb)
	if rb.Checkpoints != total || len(rb.Skipped) > 0 {
		b.Fatalf("rebuild found %d checkpoints (%d skipped), want %d", rb.Checkpoints, len(rb.Skipped), total)
	}
	// A policy that keeps a tenth of each sandbox's line: the newest few
	// and (all turns being minutes apart at most) one per hour.
	var fg api.Forgotten
	decode(b, timed("forget", "--json", "forget", "--all", "--keep-last", fmt.Sprint(max(n/sandboxes/10, 1)),
		"--keep-hourly", "24"), &fg)
	if fg.CheckpointsDeleted < n/2 {
		b.Fatalf("forget deleted %d of %d checkpoints", fg.CheckpointsDeleted, total)
	}
	var gc api.GCReport
	decode(b, timed("gc", "--json", "gc", "--grace", "0"), &gc)
	if gc.Deleted == 0 {
		b.Fatalf("gc deleted no pack after forget deleted %d checkpoints", fg.CheckpointsDeleted)
	}
	b.Logf("n=%d: turn %v, %v, catalog %d KiB, forget deleted %d, gc deleted %d packs",
		n, run.turn, run.op, run.catalog>>10, fg.CheckpointsDeleted, gc.Deleted)
	return run
}

// buildHistory makes the sandboxes and n turns through an engine opened
// the way the CLI opens a home, and returns the mean time of one turn.
// Sandbox s00 is created from base; s<i> is branched from the middle of
// s<(i-1)/2>'s line once that line is complete, so the home's lineage is a
// tree whose lines of descent cross sandboxes.
func buildHistory(b *testing.B, home, base string, n, sandboxes int) time.Duration {
	b.Helper()
	ctx := context.Background()
	e, err := engine.Open(ctx, engine.Options{Home: home, FreezeOnBranch: true})
	must(b, err)
	defer func() { e.WaitFreezes(); e.Close() }()
	per := n / sandboxes
	mids := make([]delta.ID, sandboxes)
	var spent time.Duration
	for i := range sandboxes {
		name := delta.SandboxName(fmt.Sprintf("s%02d", i))
		var root string
		if i == 0 {
			cr, err := e.CreateSandbox(ctx, name, engine.CreateOptions{Base: base})
			must(b, err)
			root = cr.Root
		} else {
			rr, err := e.Branch(ctx, catalog.IDRef(mids[(i-1)/2]), name, engine.BranchOptions{})
			must(b, err)
			root = rr.Root
		}
		for t := range per {
			data := fmt.Appendf(nil, "sandbox %s turn %d\n", name, t)
			must(b, os.WriteFile(filepath.Join(root, "src", "turn.txt"), data, 0o644))
			start := time.Now()
			r, err := e.Checkpoint(ctx, name, engine.CheckpointOptions{})
			spent += time.Since(start)
			must(b, err)
			if r.Class != delta.ClassFS {
				b.Fatalf("sandbox %s turn %d: class %s, want fs", name, t, r.Class)
			}
			if t == per/2 {
				mids[i] = r.ID
			}
		}
	}
	return spent / time.Duration(max(per*sandboxes, 1))
}

// removeAll removes the sandboxes (unmounting their roots) so the
// temporary directory can go.
func removeAll(b *testing.B, home string, sandboxes int) {
	b.Helper()
	ctx := context.Background()
	e, err := engine.Open(ctx, engine.Options{Home: home})
	must(b, err)
	defer e.Close()
	for i := range sandboxes {
		must(b, e.RemoveSandbox(ctx, delta.SandboxName(fmt.Sprintf("s%02d", i))))
	}
}

// runInProcess runs `turnsnap --home home args...` in this process, as
// main does, and returns what it printed.
func runInProcess(ctx context.Context, home string, args ...string) (string, error) {
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs(append([]string{"--home", home}, args...))
	err := root.ExecuteContext(ctx)
	return out.String(), err
}

func decode(b *testing.B, s string, v any) {
	b.Helper()
	if err := json.Unmarshal([]byte(s), v); err != nil {
		b.Fatalf("%v: %s", err, s)
	}
}

// diskUsage is the space dir's files take on disk (allocated blocks, not
// apparent sizes: Badger preallocates its value log sparsely).
func diskUsage(b *testing.B, dir string) int64 {
	b.Helper()
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		}
		return nil
	})
	must(b, err)
	return total
}
