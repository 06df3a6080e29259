package server_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
)

// editTurn changes n files of root (about 1 KiB each), distinct per turn.
func editTurn(tb testing.TB, root string, turn, n int) {
	for i := range n {
		data := fmt.Appendf(nil, "turn %d file %d\n%0900d\n", turn, i, turn*1000+i)
		if err := os.WriteFile(filepath.Join(root, fmt.Sprintf("f%02d.txt", i)), data, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
}

// BenchmarkConcurrentTurns is issue 11's throughput benchmark: S sandboxes,
// each client closing fs turns of 10 changed files as fast as it can
// through the API (one daemon, one engine), against the same turns through
// today's serialised CLI path (each turn opens the home, taking its flock,
// checkpoints and closes it, as a CLI process does; in-process, so the
// baseline does not even pay for process start-up), in the same run.
// Reported: turns/s both ways and their ratio, and the worst contended API
// turn against the median uncontended one (one client alone). The same
// clients then run paced, with a think time between turns as a model call
// gives an agent (paced_*: the machine is no longer saturated, and
// paced_cpu_load says how busy its cores were).
func BenchmarkConcurrentTurns(b *testing.B) {
	sandboxes, turns := 16, 8
	if os.Getenv("TURNSNAP_BENCH_SMALL") != "" {
		sandboxes, turns = 4, 2
	}
	const files = 10
	for iter := range b.N {
		ctx := context.Background()
		// Served as the daemon serves it: change tracking on.
		f := serve(b, nil, func(o *engine.Options) { o.TrackChanges = true })
		roots := make([]string, sandboxes)
		for i := range roots {
			roots[i] = f.create(b, fmt.Sprintf("s%d", i))
		}
		// Uncontended: one client alone, turn after turn.
		var alone []time.Duration
		aloneTurns := max(turns, 5)
		cpu0 := cpuTime()
		var callCPU time.Duration // the calls alone: the turn's own CPU
		for turn := range aloneTurns {
			editTurn(b, roots[0], 1000+turn, files)
			start, c0 := time.Now(), cpuTime()
			if _, err := f.c.Checkpoint(ctx, "s0", api.CheckpointRequest{}); err != nil {
				b.Fatal(err)
			}
			alone = append(alone, time.Since(start))
			callCPU += cpuTime() - c0
		}
		f.e.WaitFreezes()
		aloneCPU := (cpuTime() - cpu0) / time.Duration(aloneTurns)
		slices.Sort(alone)
		median := alone[len(alone)/2]
		// Unchanged turns (skips) through the API, end to end.
		var skips []time.Duration
		for range 9 {
			start := time.Now()
			r, err := f.c.Checkpoint(ctx, "s0", api.CheckpointRequest{})
			if err != nil || r.Class != "skip" {
				b.Fatalf("unchanged turn: %+v %v", r, err)
			}
			skips = append(skips, time.Since(start))
		}
		slices.Sort(skips)

		// Through the API, every client at once, as fast as it can.
		stopProfile := profileContended(b, iter)
		all, apiWall, apiCPU := turnsAtOnce(b, f, roots, turns, files, 0, nil)
		stopProfile()
		// Then with a think time between turns, as an agent's model call
		// gives one (exponential, mean thinkMean): the same clients, not
		// saturating the machine, so a turn waits only for the turns that
		// happen to coincide with it.
		paced, pacedWall, pacedCPU := turnsAtOnce(b, f, roots, turns, files, 2000, func(rng *rand.Rand) time.Duration {
			return time.Duration(rng.ExpFloat64() * float64(thinkMean))
		})
		slices.Sort(paced)
		pacedLoad := float64(pacedCPU) * float64(sandboxes*turns) / (float64(pacedWall) * float64(runtime.NumCPU()))
		slices.Sort(all)
		worst := all[len(all)-1]
		pct := func(p float64) float64 {
			return float64(all[min(len(all)-1, int(p*float64(len(all))))].Microseconds()) / 1000
		}

		// The serialised CLI path on its own home, same sandboxes and turns.
		home := filepath.Join(b.TempDir(), "cli-home")
		e, err := engine.Open(ctx, engine.Options{Home: home})
		if err != nil {
			b.Fatal(err)
		}
		croots := make([]string, sandboxes)
		for i := range croots {
			r, err := e.CreateSandbox(ctx, delta.SandboxName(fmt.Sprintf("s%d", i)), engine.CreateOptions{Base: f.base})
			if err != nil {
				b.Fatal(err)
			}
			croots[i] = r.Root
		}
		e.Close()
		b.Cleanup(func() {
			e, err := engine.Open(ctx, engine.Options{Home: home, LockWait: time.Minute})
			if err == nil {
				for i := range croots {
					e.RemoveSandbox(ctx, delta.SandboxName(fmt.Sprintf("s%d", i)))
				}
				e.Close()
			}
		})
		var wg sync.WaitGroup
		start := time.Now()
		errs := make(chan error, sandboxes)
		for i := range sandboxes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for turn := range turns {
					editTurn(b, croots[i], turn, files)
					e, err := engine.Open(ctx, engine.Options{Home: home, LockWait: 10 * time.Minute})
					if err != nil {
						errs <- err
						return
					}
					_, err = e.Checkpoint(ctx, delta.SandboxName(fmt.Sprintf("s%d", i)), engine.CheckpointOptions{})
					e.Close()
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		cliWall := time.Since(start)
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		n := float64(sandboxes * turns)
		apiRate, cliRate := n/apiWall.Seconds(), n/cliWall.Seconds()
		b.ReportMetric(apiRate, "api_turns/s")
		b.ReportMetric(cliRate, "cli_turns/s")
		b.ReportMetric(apiRate/cliRate, "x_vs_serialised_cli")
		b.ReportMetric(float64(median.Microseconds())/1000, "uncontended_median_ms")
		b.ReportMetric(float64(skips[len(skips)/2].Microseconds())/1000, "skip_median_ms")
		b.ReportMetric(float64(worst.Microseconds())/1000, "worst_contended_ms")
		b.ReportMetric(pct(0.5), "p50_contended_ms")
		b.ReportMetric(pct(0.99), "p99_contended_ms")
		b.ReportMetric(float64(apiCPU.Microseconds())/1000, "cpu_ms/contended_turn")
		b.ReportMetric(float64(aloneCPU.Microseconds())/1000, "cpu_ms/uncontended_turn")
		b.ReportMetric(float64((callCPU/time.Duration(aloneTurns)).Microseconds())/1000, "cpu_ms/uncontended_call")
		b.ReportMetric(float64(worst)/float64(median), "worst_vs_uncontended")
		// The fair share: each turn's cycle when the cores are split evenly
		// among the clients (CPU per turn, clients' edits included, times
		// clients over cores). Little's law puts the mean turn near it
		// whatever the scheduling; the worst against it is the contention
		// the daemon adds.
		fair := float64(apiCPU) * float64(sandboxes) / float64(runtime.NumCPU())
		b.ReportMetric(float64(worst)/fair, "worst_vs_fair_share")
		b.ReportMetric(float64(paced[len(paced)-1])/float64(median), "paced_worst_vs_uncontended")
		b.ReportMetric(float64(paced[len(paced)/2])/float64(median), "paced_p50_vs_uncontended")
		b.ReportMetric(float64(paced[len(paced)*99/100])/float64(median), "paced_p99_vs_uncontended")
		b.ReportMetric(float64(paced[len(paced)*9/10])/float64(median), "paced_p90_vs_uncontended")
		b.ReportMetric(pacedLoad, "paced_cpu_load")
	}
}

// thinkMean is the mean think time between a paced client's turns.
const thinkMean = 100 * time.Millisecond

// turnsAtOnce runs one client per root at once, each closing turns fs
// turns of files changed files through the API (edits numbered from
// first), waiting think() between turns when think is set. It returns
// every turn's latency, the wall time of the whole, and the process's CPU
// per turn (the daemon's background freezes included, and the clients'
// own edits and HTTP).
func turnsAtOnce(b *testing.B, f *fixture, roots []string, turns, files, first int, think func(*rand.Rand) time.Duration) ([]time.Duration, time.Duration, time.Duration) {
	ctx := context.Background()
	lat := make([][]time.Duration, len(roots))
	var wg sync.WaitGroup
	errs := make(chan error, len(roots))
	cpu0 := cpuTime()
	start := time.Now()
	for i := range roots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), uint64(first)))
			name := fmt.Sprintf("s%d", i)
			for turn := range turns {
				if think != nil {
					time.Sleep(think(rng))
				}
				editTurn(b, roots[i], first+turn, files)
				t0 := time.Now()
				r, err := f.c.Checkpoint(ctx, name, api.CheckpointRequest{})
				if err != nil || r.Class != "fs" {
					errs <- fmt.Errorf("%s turn %d: %+v %v", name, first+turn, r, err)
					return
				}
				lat[i] = append(lat[i], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	f.e.WaitFreezes()
	cpu := (cpuTime() - cpu0) / time.Duration(len(roots)*turns)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	return all, wall, cpu
}

// cpuTime is the CPU time this process has used, user and system.
func cpuTime() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// profileContended starts a CPU profile of the contended phase alone when
// TURNSNAP_BENCH_CPUPROFILE names a file (go test's -cpuprofile would
// also count the setup and the serialised baseline), one file per
// iteration (PATH.0, PATH.1, ...; `go tool pprof` merges them); it returns
// the stop.
func profileContended(b *testing.B, iter int) func() {
	path := os.Getenv("TURNSNAP_BENCH_CPUPROFILE")
	if path == "" {
		return func() {}
	}
	out, err := os.Create(fmt.Sprintf("%s.%d", path, iter))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		out.Close()
	}
}
