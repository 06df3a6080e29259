package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/client"
	"github.com/turnsnap/turnsnap/internal/benchenv"
)

// turnsClientEnv makes the test binary one agent of BenchmarkTurnsDaemon:
// TURNSNAP_TEST_TURNS_CLIENT=SOCKET,SANDBOX,ROOT,TURNS,FIRST closes TURNS
// fs turns of 10 changed files in sandbox SANDBOX (root ROOT) through the
// daemon at SOCKET, as fast as it can, and prints each checkpoint call's
// latency in nanoseconds, one a line.
const turnsClientEnv = "TURNSNAP_TEST_TURNS_CLIENT"

// turnsClient is that agent's loop (TestMain runs it).
func turnsClient(spec string) error {
	f := strings.Split(spec, ",")
	if len(f) != 5 {
		return fmt.Errorf("%s=%q: want SOCKET,SANDBOX,ROOT,TURNS,FIRST", turnsClientEnv, spec)
	}
	turns, err1 := strconv.Atoi(f[3])
	first, err2 := strconv.Atoi(f[4])
	if err1 != nil || err2 != nil || turns < 1 || turns > 10000 {
		return fmt.Errorf("%s=%q: bad counts", turnsClientEnv, spec)
	}
	c, err := client.New(client.Options{Socket: f[0]})
	if err != nil {
		return err
	}
	ctx := context.Background()
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for turn := first; turn < first+turns; turn++ {
		for i := range 10 {
			data := fmt.Appendf(nil, "turn %d file %d\n%0900d\n", turn, i, turn*1000+i)
			if err := os.WriteFile(filepath.Join(f[2], fmt.Sprintf("f%02d.txt", i)), data, 0o644); err != nil {
				return err
			}
		}
		start := time.Now()
		r, err := c.Checkpoint(ctx, f[1], api.CheckpointRequest{})
		if err != nil {
			return fmt.Errorf("sandbox %s turn %d: %w", f[1], turn, err)
		}
		if r.Class != "fs" {
			return fmt.Errorf("sandbox %s turn %d: class %s, want fs", f[1], turn, r.Class)
		}
		fmt.Fprintln(out, time.Since(start).Nanoseconds())
	}
	return nil
}

// BenchmarkTurnsDaemon is issue 11's concurrency benchmark with every part
// in its own process, as on a host: a real `turnsnap serve` (change
// tracking on, as it serves) and one client process per sandbox, each
// closing fs turns of 10 changed files as fast as it can through the
// socket. BenchmarkConcurrentTurns (server) runs the same turns
// in-process, where the clients share the daemon's Go scheduler; here the
// kernel schedules them, so the daemon's CPU priority can be set: it runs
// at nice 0 and at nice -10 (every thread), each on a fresh home. Reported
// per priority: the median uncontended call (one client alone), the
// contended median, p99 and worst, their ratios to it, and turns/s.
func BenchmarkTurnsDaemon(b *testing.B) {
	sandboxes, turns := 16, 8
	if benchenv.Small() {
		sandboxes, turns = 4, 2
	}
	for _, nice := range []int{0, -10} {
		b.Run(fmt.Sprintf("nice=%d", nice), func(b *testing.B) {
			for range b.N {
				benchTurnsDaemon(b, nice, sandboxes, turns)
			}
		})
	}
}

func benchTurnsDaemon(b *testing.B, nice, sandboxes, turns int) {
	dir := b.TempDir()
	home, base := filepath.Join(dir, "home"), filepath.Join(dir, "base")
	must(b, os.MkdirAll(filepath.Join(base, "src"), 0o755))
	must(b, os.WriteFile(filepath.Join(base, "src", "a.txt"), []byte("base\n"), 0o644))
	d := startDaemon(b, home, nil)
	if nice != 0 {
		reniceAll(b, d.cmd.Process.Pid, nice)
	}
	c := d.client(b)
	ctx := context.Background()
	roots := make([]string, sandboxes)
	for i := range roots {
		cr, err := c.CreateSandbox(ctx, api.CreateRequest{Name: fmt.Sprintf("s%d", i), Base: base})
		must(b, err)
		roots[i] = cr.Root
	}
	sock := filepath.Join(home, socketName)
	alone := runTurnClients(b, sock, roots[:1], max(turns, 9), 1000)[0]
	slices.Sort(alone)
	median := alone[len(alone)/2]
	start := time.Now()
	lat := runTurnClients(b, sock, roots, turns, 0)
	wall := time.Since(start)
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	at := func(p float64) time.Duration { return all[min(len(all)-1, int(p*float64(len(all))))] }
	b.ReportMetric(ms(median), "uncontended_median_ms")
	b.ReportMetric(ms(at(0.5)), "p50_contended_ms")
	b.ReportMetric(ms(at(0.99)), "p99_contended_ms")
	b.ReportMetric(ms(all[len(all)-1]), "worst_contended_ms")
	b.ReportMetric(float64(at(0.5))/float64(median), "p50_vs_uncontended")
	b.ReportMetric(float64(all[len(all)-1])/float64(median), "worst_vs_uncontended")
	b.ReportMetric(float64(len(all))/wall.Seconds(), "turns/s")
	for i := range roots {
		_, err := c.RemoveSandbox(ctx, fmt.Sprintf("s%d", i), false) // unmounts its root
		must(b, err)
	}
	if code := d.stop(b); code != 0 {
		b.Fatalf("turnsnap serve exited %d", code)
	}
}

// runTurnClients runs one client process per root (sandbox s<i>), all at
// once, and returns each one's call latencies.
func runTurnClients(b *testing.B, sock string, roots []string, turns, first int) [][]time.Duration {
	out := make([][]time.Duration, len(roots))
	errs := make([]error, len(roots))
	var wg sync.WaitGroup
	for i, root := range roots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,s%d,%s,%d,%d", turnsClientEnv, sock, i, root, turns, first))
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				errs[i] = fmt.Errorf("client of s%d: %v: %s", i, err, stderr.String())
				return
			}
			for line := range strings.Lines(stdout.String()) {
				n, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
				if err != nil {
					errs[i] = fmt.Errorf("client of s%d printed %q", i, line)
					return
				}
				out[i] = append(out[i], time.Duration(n))
			}
			if len(out[i]) != turns {
				errs[i] = fmt.Errorf("client of s%d closed %d turns of %d", i, len(out[i]), turns)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	return out
}

func must(b testing.TB, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

// reniceAll sets the nice value of every thread of process pid (Linux
// keeps one per thread; threads made later inherit their creator's).
func reniceAll(b *testing.B, pid, nice int) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	must(b, err)
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil {
			b.Fatalf("setpriority of thread %d of the daemon: %v", tid, err)
		}
	}
}
