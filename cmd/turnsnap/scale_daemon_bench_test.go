package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/client"
	"github.com/turnsnap/turnsnap/internal/benchenv"
)

// BenchmarkScaleSandboxesDaemon is issue 27, section 4, second half: many
// sandboxes on one real `turnsnap serve` (change tracking on, as it
// serves), each closing tracked 10-file turns at an agent's pace (one turn
// every 2-5 s, jittered) through the socket, while one client follows the
// events stream and another scrapes /metrics every second. The baseline,
// in the same run and on the same daemon, is the same paced turn with one
// sandbox on it. Reported: turn latency p50/p99 and their ratios to the
// baseline's; the daemon's RSS and open fds (from /proc/PID) idle, with
// one sandbox, after every sandbox was created, at the end of the run and
// its peak, and their growth per sandbox (end of the run against one
// sandbox: each tracked, each agent's client connected);
// the lag of each turn's committed event after the turn's reply; the
// latency of the /metrics scrapes during the run; the load.
// Full: 64 sandboxes for 120 s (baseline 8 turns); small: 4 for 12 s.
func BenchmarkScaleSandboxesDaemon(b *testing.B) {
	sandboxes := benchenv.Size(64, 4)
	run := time.Duration(benchenv.Size(120, 12)) * time.Second
	baseTurns := benchenv.Size(8, 3)
	for range b.N {
		benchScaleSandboxes(b, sandboxes, baseTurns, run)
	}
}

// daemonSample is the daemon's footprint at one moment.
type daemonSample struct {
	rss int64 // bytes
	fds int
}

func sampleDaemon(pid int) (daemonSample, error) {
	var s daemonSample
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			if err != nil {
				return s, fmt.Errorf("VmRSS of the daemon: %w", err)
			}
			s.rss = kb << 10
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	s.fds = len(fds)
	return s, err
}

// daemonCPU is the CPU time (user and system) process pid has used, from
// /proc/PID/stat (in clock ticks of 10 ms: USER_HZ is 100 on Linux).
func daemonCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces: the fields after it follow ")".
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// fdKinds counts the daemon's open fds by what they are, for the log:
// sockets and pipes by kind, anon inodes by name, files by their first
// two path components (the home's path folded to HOME).
func fdKinds(pid int, home string) map[string]int {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, _ := os.ReadDir(dir)
	out := map[string]int{}
	for _, fd := range fds {
		t, err := os.Readlink(filepath.Join(dir, fd.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		t = strings.ReplaceAll(t, home, "HOME")
		switch {
		case strings.HasPrefix(t, "socket:"), strings.HasPrefix(t, "pipe:"):
			t = t[:strings.IndexByte(t, ':')]
		case strings.Contains(t, "/"):
			parts := strings.SplitN(t, "/", 4)
			t = strings.Join(parts[:min(len(parts), 3)], "/")
		}
		out[t]++
	}
	return out
}

// turnDone is one turn an agent closed: its checkpoint, the call's
// latency, and when the reply came.
type turnDone struct {
	id      string
	lat     time.Duration
	replied time.Time
}

// pacedTurns closes 10-file turns in sandbox name (root root) until
// deadline (or turns of them, if turns > 0), sleeping 2-5 s (jittered)
// before each.
func pacedTurns(ctx context.Context, c *client.Client, name, root string, turns int, deadline time.Time, rng *rand.Rand) ([]turnDone, error) {
	var out []turnDone
	for turn := 0; turns == 0 || turn < turns; turn++ {
		pause := 2*time.Second + time.Duration(rng.Int64N(int64(3*time.Second)))
		if turns == 0 && time.Now().Add(pause).After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case <-time.After(pause):
		}
		for i := range 10 {
			data := fmt.Appendf(nil, "turn %d file %d\n%0900d\n", turn, i, turn*1000+i)
			if err := os.WriteFile(filepath.Join(root, "src", fmt.Sprintf("f%02d.txt", i)), data, 0o644); err != nil {
				return out, err
			}
		}
		start := time.Now()
		r, err := c.Checkpoint(ctx, name, api.CheckpointRequest{})
		if err != nil {
			return out, fmt.Errorf("sandbox %s turn %d: %w", name, turn, err)
		}
		now := time.Now()
		if r.Class != "fs" {
			return out, fmt.Errorf("sandbox %s turn %d: class %s, want fs", name, turn, r.Class)
		}
		out = append(out, turnDone{id: r.ID.String(), lat: now.Sub(start), replied: now})
	}
	return out, nil
}

// commitArrivals follows the daemon's events and keeps when each committed
// turn's event arrived.
type commitArrivals struct {
	mu   sync.Mutex
	seen map[string]arrival
}

// arrival is a committed event: when it came, and the engine's own
// account of the turn (its time from admission to commit, by phase).
type arrival struct {
	at       time.Time
	engineMS float64
	phasesMS map[string]float64
}

func (l *commitArrivals) follow(ctx context.Context, c *client.Client) error {
	return c.Events(ctx, "", func(ev api.Event) error {
		if ev.Type == "committed" && ev.Checkpoint != "" {
			l.mu.Lock()
			l.seen[ev.Checkpoint] = arrival{at: time.Now(), engineMS: ev.DurationMS, phasesMS: ev.PhasesMS}
			l.mu.Unlock()
		}
		return nil
	})
}

func benchScaleSandboxes(b *testing.B, sandboxes, baseTurns int, run time.Duration) {
	loadStart := benchenv.Load1(b)
	dir := b.TempDir()
	home, base := filepath.Join(dir, "home"), filepath.Join(dir, "base")
	must(b, os.MkdirAll(filepath.Join(base, "src"), 0o755))
	for i := range 10 {
		must(b, os.WriteFile(filepath.Join(base, "src", fmt.Sprintf("f%02d.txt", i)), []byte("base\n"), 0o644))
	}
	d := startDaemon(b, home, nil)
	pid := d.cmd.Process.Pid
	c := d.client(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rng := rand.New(rand.NewPCG(27, 4))

	events := &commitArrivals{seen: map[string]arrival{}}
	evDone := make(chan error, 1)
	ec := d.client(b)
	go func() { evDone <- events.follow(ctx, ec) }()

	sample := func() daemonSample {
		s, err := sampleDaemon(pid)
		must(b, err)
		return s
	}
	idle := sample()
	roots := make([]string, sandboxes)
	create := func(i int) {
		cr, err := c.CreateSandbox(ctx, api.CreateRequest{Name: fmt.Sprintf("s%02d", i), Base: base})
		must(b, err)
		roots[i] = cr.Root
	}
	create(0)
	cpu := func() time.Duration {
		d, err := daemonCPU(pid)
		must(b, err)
		return d
	}
	cpu0 := cpu()
	alone, err := pacedTurns(ctx, d.client(b), "s00", roots[0], baseTurns, time.Time{}, rng)
	must(b, err)
	cpuAlone := cpu() - cpu0
	one := sample()
	oneM := scrapeGo(b, ctx, c)
	for i := 1; i < sandboxes; i++ {
		create(i)
	}
	created := sample()

	// The run: every sandbox's agent, a sampler of the daemon's footprint
	// and a scraper of /metrics.
	cpu1 := cpu()
	deadline := time.Now().Add(run)
	var mu sync.Mutex
	var turns []turnDone
	var errs []error
	var wg sync.WaitGroup
	for i := range sandboxes {
		seed, ci := rng.Uint64(), d.client(b) // one client each, as separate agents have
		wg.Go(func() {
			t, err := pacedTurns(ctx, ci, fmt.Sprintf("s%02d", i), roots[i], 0, deadline, rand.New(rand.NewPCG(seed, uint64(i))))
			mu.Lock()
			defer mu.Unlock()
			turns = append(turns, t...)
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	peak := created
	var scrapes []time.Duration
	var heapAlloc float64
	stopSampling := make(chan struct{})
	sampled := make(chan error, 1)
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				sampled <- nil
				return
			case <-tick.C:
			}
			s, err := sampleDaemon(pid)
			if err != nil {
				sampled <- fmt.Errorf("the daemon's footprint during the run: %w", err)
				return
			}
			peak.rss, peak.fds = max(peak.rss, s.rss), max(peak.fds, s.fds)
			start := time.Now()
			m, err := c.Metrics(ctx)
			if err != nil {
				sampled <- fmt.Errorf("/metrics during the run: %w", err)
				return
			}
			scrapes = append(scrapes, time.Since(start))
			heapAlloc = max(heapAlloc, metricValue(m, "go_memstats_heap_alloc_bytes"))
		}
	}()
	wg.Wait()
	close(stopSampling)
	must(b, <-sampled)
	must(b, errors.Join(errs...))
	cpuRun := cpu() - cpu1
	end := sample() // every sandbox has turned: tracked, its agent connected
	endM := scrapeGo(b, ctx, c)
	b.Logf("daemon fds at the end of the run (%d sandboxes), by kind: %v", sandboxes, fdKinds(pid, home))

	// Every turn's committed event arrived (allow a second for the last).
	var lags []time.Duration
	arrived := map[string]arrival{}
	waitUntil := time.Now().Add(time.Second)
	for _, t := range append(alone, turns...) {
		for {
			events.mu.Lock()
			a, ok := events.seen[t.id]
			events.mu.Unlock()
			if ok {
				lags = append(lags, a.at.Sub(t.replied))
				arrived[t.id] = a
				break
			}
			if time.Now().After(waitUntil) {
				b.Fatalf("no committed event for checkpoint %s", t.id)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	cancel()
	if err := <-evDone; err != nil && !errors.Is(err, context.Canceled) {
		b.Fatalf("events stream ended: %v", err)
	}
	if len(turns) < sandboxes {
		b.Fatalf("%d turns in the run over %d sandboxes", len(turns), sandboxes)
	}

	lat := func(ts []turnDone) []time.Duration {
		out := make([]time.Duration, len(ts))
		for i, t := range ts {
			out[i] = t.lat
		}
		return out
	}
	pct := func(d []time.Duration, p float64) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[min(len(s)-1, int(p*float64(len(s))))]
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	mib := func(n int64) float64 { return float64(n) / (1 << 20) }
	base50, base99 := pct(lat(alone), 0.5), pct(lat(alone), 0.99)
	all50, all99 := pct(lat(turns), 0.5), pct(lat(turns), 0.99)
	b.ReportMetric(ms(base50), "turn-p50-ms@1")
	b.ReportMetric(ms(base99), "turn-p99-ms@1")
	b.ReportMetric(ms(all50), fmt.Sprintf("turn-p50-ms@%d", sandboxes))
	b.ReportMetric(ms(all99), fmt.Sprintf("turn-p99-ms@%d", sandboxes))
	b.ReportMetric(float64(all50)/float64(base50), "p50-x-alone")
	b.ReportMetric(float64(all99)/float64(base99), "p99-x-alone")
	b.ReportMetric(float64(len(turns))/run.Seconds(), "turns/s")
	// The daemon's CPU per turn (everything it did meanwhile included:
	// background freezes, event and metrics answers): a turn that costs
	// the same CPU at 64 as alone but takes longer waited for the CPU.
	cpuPerAlone := cpuAlone / time.Duration(len(alone))
	cpuPerRun := cpuRun / time.Duration(len(turns))
	b.ReportMetric(ms(cpuPerAlone), "daemon-cpu-ms/turn@1")
	b.ReportMetric(ms(cpuPerRun), fmt.Sprintf("daemon-cpu-ms/turn@%d", sandboxes))
	b.ReportMetric(cpuRun.Seconds()/run.Seconds(), fmt.Sprintf("daemon-cores@%d", sandboxes))
	b.ReportMetric(mib(idle.rss), "rss-MiB-idle")
	b.ReportMetric(mib(one.rss), "rss-MiB@1")
	b.ReportMetric(mib(end.rss), fmt.Sprintf("rss-MiB@%d", sandboxes))
	b.ReportMetric(mib(peak.rss), fmt.Sprintf("rss-MiB-peak@%d", sandboxes))
	b.ReportMetric(float64(end.rss-one.rss)/float64(sandboxes-1)/1024, "rss-KiB/sandbox")
	b.ReportMetric(heapAlloc/(1<<20), "go-heap-MiB-peak")
	// Where a sandbox's RSS goes, from the daemon's Go collector.
	perSandbox := func(name string) float64 { return (endM[name] - oneM[name]) / float64(sandboxes-1) }
	b.ReportMetric(perSandbox("go_goroutines"), "goroutines/sandbox")
	b.ReportMetric(perSandbox("go_memstats_heap_inuse_bytes")/1024, "heap-inuse-KiB/sandbox")
	b.ReportMetric(perSandbox("go_memstats_stack_inuse_bytes")/1024, "stack-KiB/sandbox")
	b.ReportMetric(perSandbox("go_memstats_next_gc_bytes")/1024, "gc-target-KiB/sandbox")
	// Where a turn's time goes: the engine's own time (after its
	// admission slot) against the client's, over the run's turns and
	// its slowest percent.
	var engineT, outside []time.Duration
	tail := pct(lat(turns), 0.99)
	tailPhases := map[string]float64{}
	var tailN int
	var tailLat, tailEngine time.Duration
	for _, t := range turns {
		a := arrived[t.id]
		ed := time.Duration(a.engineMS * float64(time.Millisecond))
		engineT, outside = append(engineT, ed), append(outside, t.lat-ed)
		if t.lat >= tail {
			tailN++
			tailLat, tailEngine = tailLat+t.lat, tailEngine+ed
			for k, v := range a.phasesMS {
				tailPhases[k] += v
			}
		}
	}
	for k := range tailPhases {
		tailPhases[k] /= float64(max(tailN, 1))
	}
	b.ReportMetric(ms(pct(engineT, 0.5)), "engine-p50-ms")
	b.ReportMetric(ms(pct(engineT, 0.99)), "engine-p99-ms")
	b.ReportMetric(ms(pct(outside, 0.99)), "outside-engine-p99-ms")
	b.ReportMetric(1000*endM["turnsnap_checkpoint_queue_wait_seconds_sum"]/max(endM["turnsnap_checkpoint_queue_wait_seconds_count"], 1), "admission-wait-mean-ms")
	b.Logf("slowest %d turns (>= p99 %v): mean latency %v, of it in the engine %v; engine phases (mean ms): %v",
		tailN, tail, tailLat/time.Duration(max(tailN, 1)), tailEngine/time.Duration(max(tailN, 1)), tailPhases)
	b.ReportMetric(float64(idle.fds), "fds-idle")
	b.ReportMetric(float64(one.fds), "fds@1")
	b.ReportMetric(float64(created.fds), fmt.Sprintf("fds-created@%d", sandboxes))
	b.ReportMetric(float64(end.fds), fmt.Sprintf("fds@%d", sandboxes))
	b.ReportMetric(float64(peak.fds), fmt.Sprintf("fds-peak@%d", sandboxes))
	b.ReportMetric(float64(end.fds-one.fds)/float64(sandboxes-1), "fds/sandbox")
	b.ReportMetric(ms(pct(lags, 0.5)), "event-lag-p50-ms")
	b.ReportMetric(ms(pct(lags, 0.99)), "event-lag-p99-ms")
	b.ReportMetric(ms(pct(scrapes, 0.5)), "metrics-p50-ms")
	b.ReportMetric(ms(pct(scrapes, 0.99)), "metrics-p99-ms")
	b.ReportMetric(loadStart, "load1-start")
	b.ReportMetric(benchenv.Load1(b), "load1-end")

	for i := range sandboxes {
		_, err := c.RemoveSandbox(context.Background(), fmt.Sprintf("s%02d", i), false) // unmounts its root
		must(b, err)
	}
	if code := d.stop(b); code != 0 {
		b.Fatalf("turnsnap serve exited %d", code)
	}
}

// scrapeGo reads the daemon's /metrics for the figures that explain its
// footprint and its turns' waits.
func scrapeGo(b *testing.B, ctx context.Context, c *client.Client) map[string]float64 {
	b.Helper()
	text, err := c.Metrics(ctx)
	must(b, err)
	out := map[string]float64{}
	for _, name := range []string{"go_goroutines", "go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes",
		"go_memstats_next_gc_bytes", "turnsnap_checkpoint_queue_wait_seconds_sum", "turnsnap_checkpoint_queue_wait_seconds_count"} {
		out[name] = metricValue(text, name)
	}
	return out
}

// metricValue is the sum of metric name's samples over all their labels
// in Prometheus text (0 if absent).
func metricValue(text, name string) float64 {
	var sum float64
	for line := range strings.Lines(text) {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f := strings.Fields(rest)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}
