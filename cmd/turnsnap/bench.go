package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/bench/harness"
	"github.com/turnsnap/turnsnap/bench/report"
	"github.com/turnsnap/turnsnap/bench/trace"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
)

type benchOpts struct {
	traces, out, work string
	minio             string
	seeds, sandboxes  int
	latencyScale      float64
	keep, coloOnly    bool
	crashAfterStart   bool // the quick test's forced crash turn
}

func (a *app) benchCmd() *cobra.Command {
	var o benchOpts
	c := &cobra.Command{
		Use:   "bench",
		Short: "Replay agent traces with crash injection against turnsnap and the baselines; write a report",
		Long: `bench replays every trace of --traces (docs/BENCH.md) through a real
turnsnap serve, started on a fresh home, once per method: fault_free (no
checkpoints, no crash), turnsnap, full_per_turn (tar+zstd of the root plus a
CRIU dump when processes run), chat_only (restart from the base) and chat_fs
(files restored, processes not). Every run but fault_free crashes at a turn
drawn from the seed (SIGKILL of the sandbox's processes and of the daemon),
recovers its way, replays from the turn after the last checkpoint and runs
the trace's verifier. Then N sandboxes replay at once for N in 1, 4, 16, 32
up to --sandboxes. It writes result.json, REPORT.md and SVG plots into --out.

Each checkpoint starts at its turn's boundary and runs during the turn's
model latency, as through the LLM proxy; the next turn waits for it to
commit (the gate). --latency-scale multiplies the traces' model latencies
(below 1 shortens the run and is the pessimistic case for the checkpointing
methods). With a MinIO binary (--minio, found in the turnsnap cache by
default) the home gets a MinIO remote on 127.0.0.1 and the daemon uploads
in the background while the traces replay; bytes_uploaded is measured.
Needs root, runc, CRIU and busybox-static. --home is not used.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.runBench(cmd.Context(), o) },
	}
	f := c.Flags()
	f.StringVar(&o.traces, "traces", "bench/traces", "directory of trace files (*.json)")
	f.StringVar(&o.out, "out", "bench-out", "directory for result.json, REPORT.md and the plots")
	f.StringVar(&o.work, "work", "", "scratch directory for the home, bases and archives (default: a new temporary directory, removed)")
	f.IntVar(&o.seeds, "seeds", 1, "seeds (crash turns) per trace")
	f.IntVar(&o.sandboxes, "sandboxes", 16, "most sandboxes co-located at once (runs N = 1, 4, 16, 32 up to this; 0: none)")
	f.Float64Var(&o.latencyScale, "latency-scale", 1, "multiply every turn's model latency by this (0 < x <= 10)")
	f.StringVar(&o.minio, "minio", "auto", `MinIO server binary for a remote on 127.0.0.1 ("auto": $TURNSNAP_CACHE/bin/minio if present; "none": no remote)`)
	f.BoolVar(&o.keep, "keep", false, "keep the scratch directory")
	f.BoolVar(&o.coloOnly, "colocation-only", false, "run only the co-location series (no crash runs; needs --sandboxes >= 1)")
	f.BoolVar(&o.crashAfterStart, "crash-after-start", false, "crash at the second turn after the first process start (for tests)")
	c.AddCommand(a.benchConvertCmd())
	return c
}

func (a *app) benchConvertCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "convert NEUTRAL.json [TRACE.json]",
		Short: "Convert a session in the neutral form (docs/BENCH.md) into a version 2 trace",
		Long: `convert reads a session recorded outside turnsnap in the neutral form
(base files, commands run with /bin/sh in a working directory, detached
starts, the model latency before each turn, a verifier, an end probe; see
docs/BENCH.md) and writes the version 2 trace that replays it, checked as
bench would load it, to TRACE.json (default: stdout).`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			in, err := os.ReadFile(args[0])
			if err != nil {
				return fmt.Errorf("bench convert: %w", err)
			}
			t, err := trace.FromNeutral(in)
			if err != nil {
				return fmt.Errorf("bench convert %s: %w", args[0], err)
			}
			b, err := json.MarshalIndent(t, "", "  ")
			if err != nil {
				return err
			}
			b = append(b, '\n')
			if len(args) == 1 {
				_, err = a.stdout().Write(b)
				return err
			}
			return os.WriteFile(args[1], b, 0o644)
		},
	}
}

func (a *app) runBench(ctx context.Context, o benchOpts) error {
	if o.seeds < 1 || o.seeds > 1000 || o.sandboxes < 0 || o.sandboxes > 256 {
		return fmt.Errorf("bench: --seeds must be 1..1000 and --sandboxes 0..256: %w", errdefs.ErrInvalid)
	}
	if o.coloOnly && o.sandboxes < 1 {
		return fmt.Errorf("bench: --colocation-only needs --sandboxes 1 or more: %w", errdefs.ErrInvalid)
	}
	if !(o.latencyScale > 0 && o.latencyScale <= 10) {
		return fmt.Errorf("bench: --latency-scale %v must be above 0 and at most 10: %w", o.latencyScale, errdefs.ErrInvalid)
	}
	minioBin, err := benchMinIO(o.minio)
	if err != nil {
		return err
	}
	traces, err := trace.LoadDir(o.traces)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	work := o.work
	if work == "" {
		if work, err = os.MkdirTemp("", "turnsnap-bench-"); err != nil {
			return err
		}
		if !o.keep {
			defer os.RemoveAll(work)
		}
	}
	var colo []int
	for _, n := range []int{1, 4, 16, 32} {
		if n <= o.sandboxes {
			colo = append(colo, n)
		}
	}
	cfg := harness.Config{Home: filepath.Join(work, "home"), Work: filepath.Join(work, "scratch"), Seeds: o.seeds, Colocate: colo, Log: a.log,
		LatencyScale: o.latencyScale, MinIO: minioBin, ColocationOnly: o.coloOnly,
		Daemon: func(home string) *exec.Cmd {
			cmd := exec.Command(self, "--home", home, "serve")
			cmd.Env = os.Environ()
			return cmd
		}}
	if o.crashAfterStart {
		cfg.CrashTurn = func(turns, first, _ int) int { return min(max(first+2, 2), turns) }
	}
	var progressMu sync.Mutex
	p := mpb.NewWithContext(ctx, mpb.WithOutput(os.Stderr), mpb.WithWidth(40))
	var bar *mpb.Bar
	var what atomic.Value
	what.Store("")
	cfg.Progress = func(s harness.Step) { // calls come one at a time per run, concurrently in co-location
		what.Store(s.What)
		progressMu.Lock()
		defer progressMu.Unlock()
		if bar == nil {
			bar = p.AddBar(int64(s.Total), mpb.PrependDecorators(decor.Name("bench "), decor.CountersNoUnit("%d/%d")),
				mpb.AppendDecorators(decor.Any(func(decor.Statistics) string { return what.Load().(string) })))
		}
		bar.SetCurrent(int64(s.Done))
	}
	h, err := harness.New(ctx, cfg)
	if err != nil {
		return err
	}
	res, err := h.Bench(ctx, traces)
	cerr := h.Close()
	if bar != nil {
		bar.SetTotal(-1, true)
	}
	p.Wait()
	if err != nil {
		return err
	}
	if cerr != nil {
		a.log.Warn("bench: stopping the daemon", "err", cerr)
	}
	sum := harness.Summarise(res)
	for _, v := range sum.Invalid {
		// Also said in the report; a log line too, for whoever reads only
		// the JSON's numbers.
		a.log.Warn("bench: INVALID trace, its fault-free run did not pass; no correctness figure counts it", "trace", v.Trace, "seed", v.Seed, "reason", v.Reason)
	}
	if err := report.Write(o.out, res, sum); err != nil {
		return err
	}
	if a.json {
		return printJSON(a.stdout(), sum)
	}
	fmt.Fprint(a.stdout(), report.Markdown(sum))
	fmt.Fprintf(a.stdout(), "\nwritten to %s\n", o.out)
	return nil
}

// benchMinIO resolves --minio to a binary path ("" for no remote).
func benchMinIO(flag string) (string, error) {
	switch flag {
	case "none", "":
		return "", nil
	case "auto":
		cache := os.Getenv("TURNSNAP_CACHE")
		if cache == "" {
			cache = "/var/cache/turnsnap"
		}
		bin := filepath.Join(cache, "bin", "minio")
		if st, err := os.Stat(bin); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return bin, nil
		}
		return "", nil
	}
	st, err := os.Stat(flag)
	if err != nil || !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("bench: --minio %s is not an executable file: %w", flag, errdefs.ErrInvalid)
	}
	return flag, nil
}
