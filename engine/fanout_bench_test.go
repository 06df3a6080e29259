package engine

import (
	"context"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/benchenv"
	"golang.org/x/sys/unix"
)

// Needs root, overlayfs, runc, busybox-static and CRIU (requireProcs).

// fanoutPage is what the parent's web server serves (busyboxBase's page).
const fanoutPage = "hello from turn 3"

// BenchmarkScaleFanout is issue 27's full-state fan-out: `branch --count
// N` of a checkpoint whose sandbox runs a web server, each branch ready
// (its restored server answers an HTTP request, made inside the branch's
// own network namespace) and verified (its receipt: files and processes),
// for N = 1, 4, 16, 64, against N sequential Branch calls (each also
// waited for until it answers) in the same run. The parent's writable
// layer holds 2,000 and 50,000 files (TURNSNAP_BENCH_SMALL: 200 and
// 2,000 files, N = 1 and 4), so the per-branch cost can be compared
// across file counts. Metrics per N: the fan-out's and the sequential
// calls' times, their ratio, the cost per branch, each phase of the
// fan-out per branch (BranchPhases), and the 1-minute load at the start
// and end.
func BenchmarkScaleFanout(b *testing.B) {
	requireProcs(b)
	fileCounts := []int{benchenv.Size(2000, 200), benchenv.Size(50000, 2000)}
	counts := []int{1, 4, 16, 64}
	if benchenv.Small() {
		counts = []int{1, 4}
	}
	perBranch := map[string]map[int]float64{} // N -> files -> ms per branch
	for _, files := range fileCounts {
		b.Run(fmt.Sprintf("files=%d", files), func(b *testing.B) {
			e, ckpt := fanoutParent(b, files)
			for _, n := range counts {
				fanoutN(b, e, ckpt, files, n, perBranch)
			}
		})
	}
	for _, n := range counts {
		m := perBranch[strconv.Itoa(n)]
		lo, hi := m[fileCounts[0]], m[fileCounts[1]]
		if lo > 0 && hi > 0 {
			b.Logf("N=%d: per branch %.1f ms at %d files, %.1f ms at %d files (%.2fx)", n, lo, fileCounts[0], hi, fileCounts[1], hi/lo)
		}
	}
}

// fanoutN runs BenchmarkScaleFanout's sub-benchmark of n branches of ckpt
// (whose sandbox has files files) and notes its cost per branch.
func fanoutN(b *testing.B, e *Engine, ckpt string, files, n int, perBranch map[string]map[int]float64) {
	ctx := context.Background()
	b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
		load0 := benchenv.Load1(b)
		names, err := BranchNames("fo", n)
		must(b, err)
		var fan, seq time.Duration
		var ph BranchPhases
		for b.Loop() {
			start := time.Now()
			rs, err := e.BranchMany(ctx, mustRef(ckpt), sandboxNames(names), BranchOptions{})
			must(b, err)
			for _, r := range rs {
				fanoutReady(b, e, r)
			}
			fan += time.Since(start)
			p := rs[0].Phases
			ph.Prepare += p.Prepare
			ph.Image += p.Image
			ph.Roots += p.Roots
			ph.Catalog += p.Catalog
			ph.Files += p.Files
			ph.Processes += p.Processes
			b.StopTimer()
			fanoutRemove(b, e, names)
			b.StartTimer()
			start = time.Now()
			for _, nm := range names {
				r, err := e.Branch(ctx, mustRef(ckpt), delta.SandboxName(nm), BranchOptions{})
				must(b, err)
				fanoutReady(b, e, r)
			}
			seq += time.Since(start)
			b.StopTimer()
			fanoutRemove(b, e, names)
			b.StartTimer()
		}
		loops := float64(b.N)
		ms := func(d time.Duration) float64 { return float64(d) / 1e6 / loops }
		perN := func(d time.Duration) float64 { return ms(d) / float64(n) }
		b.ReportMetric(ms(fan), "fanout-ms")
		b.ReportMetric(ms(seq), "sequential-ms")
		b.ReportMetric(float64(seq)/float64(fan), "sequential/fanout")
		b.ReportMetric(perN(fan), "per-branch-ms")
		b.ReportMetric(perN(ph.Prepare), "prepare-ms/branch")
		b.ReportMetric(perN(ph.Image), "image-ms/branch")
		b.ReportMetric(perN(ph.Roots), "roots-ms/branch")
		b.ReportMetric(perN(ph.Catalog), "catalog-ms/branch")
		b.ReportMetric(perN(ph.Files), "files-ms/branch")
		b.ReportMetric(perN(ph.Processes), "procs-ms/branch")
		b.ReportMetric(load0, "load1-start")
		b.ReportMetric(benchenv.Load1(b), "load1-end")
		key := strconv.Itoa(n)
		if perBranch[key] == nil {
			perBranch[key] = map[int]float64{}
		}
		perBranch[key][files] = perN(fan)
	})
}

// fanoutParent makes a sandbox whose writable layer holds files files
// and whose container runs busybox httpd, checkpoints it (class full),
// waits for the checkpoint's frozen layer and returns the checkpoint.
func fanoutParent(b *testing.B, files int) (*Engine, string) {
	ctx := context.Background()
	e := newEngine(b)
	cr, err := e.CreateSandbox(ctx, "src", CreateOptions{Base: busyboxBase(b)})
	must(b, err)
	rng := rand.New(rand.NewSource(int64(files)))
	for i := range files {
		p := filepath.Join(cr.Root, "src", fmt.Sprintf("d%03d/f%05d.go", i/200, i))
		if i%200 == 0 {
			must(b, os.MkdirAll(filepath.Dir(p), 0o755))
		}
		must(b, os.WriteFile(p, fileBody(rng, 200+rng.Intn(1800)), 0o644))
	}
	_, err = e.Processes().Exec(ctx, "src", []string{"httpd", "-f", "-p", "8080", "-h", "/www"}, ExecOptions{Detach: true})
	must(b, err)
	waitAnswer(b, e, "src")
	c, err := e.Checkpoint(ctx, "src", CheckpointOptions{})
	must(b, err)
	if c.Class != delta.ClassFull {
		b.Fatalf("the parent's checkpoint classed %s, want full", c.Class)
	}
	e.WaitFreezes()
	return e, c.ID.String()
}

// fanoutReady checks one branch of the fan-out: its receipt (files and
// processes) and its restored server's answer.
func fanoutReady(b *testing.B, e *Engine, r *RestoreResult) {
	if !r.Processes || r.Receipt == nil || !r.Receipt.OK {
		b.Fatalf("branch %s: processes %v, receipt %+v", r.Sandbox, r.Processes, r.Receipt)
	}
	waitAnswer(b, e, r.Sandbox)
}

func fanoutRemove(b *testing.B, e *Engine, names []string) {
	for _, n := range names {
		must(b, e.RemoveSandbox(context.Background(), delta.SandboxName(n)))
	}
}

// waitAnswer waits (at most 10 s) until the web server in sandbox's
// container answers with fanoutPage.
func waitAnswer(tb testing.TB, e *Engine, sandbox string) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := httpGetIn(sandboxNetns(e, sandbox), "127.0.0.1:8080", "/index.html")
		if err == nil && strings.Contains(got, fanoutPage) {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("sandbox %s: web server never answered: %q, %v", sandbox, got, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sandboxNetns is the pinned network namespace of sandbox's container
// (proc/netns.go).
func sandboxNetns(e *Engine, sandbox string) string {
	return filepath.Join(e.procs.StateRoot(), "netns", e.procs.ContainerID(sandbox))
}

// httpGetIn sends GET path to addr from inside the network namespace
// pinned at nsPath and returns the whole response. The socket is made on
// a thread that entered the namespace; it stays there once the thread
// goes back, so the request itself runs like any other.
func httpGetIn(nsPath, addr, path string) (string, error) {
	type dialed struct {
		c   net.Conn
		err error
	}
	ch := make(chan dialed, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- dialed{nil, err}
			return
		}
		defer unix.Close(orig)
		target, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- dialed{nil, err}
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- dialed{nil, err}
			return
		}
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		// A thread that cannot go back stays locked: the runtime ends it
		// with this goroutine.
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- dialed{c, err}
	}()
	d := <-ch
	if d.err != nil {
		return "", d.err
	}
	defer d.c.Close()
	d.c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintf(d.c, "GET %s HTTP/1.0\r\nHost: sandbox\r\n\r\n", path); err != nil {
		return "", err
	}
	body, err := io.ReadAll(d.c)
	return string(body), err
}
