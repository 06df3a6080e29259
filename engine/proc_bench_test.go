package engine

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/benchenv"
)

// BenchmarkProcessCheckpoint measures a sandbox holding one large process
// (proc/testdata/memhog: pseudo-random pages, every page touched) through
// the product path: pause, CRIU dump, image into the content store, and
// restore. Baselines in the same run: the second dump's new bytes against
// the first image's bytes (dedup without soft-dirty tracking), and the pause
// against the whole checkpoint. TURNSNAP_BENCH_SMALL shrinks the process.
func BenchmarkProcessCheckpoint(b *testing.B) {
	requireProcs(b)
	ctx := context.Background()
	mib := 200
	if benchenv.Small() {
		mib = 20
	}
	base := busyboxBase(b)
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(base, "bin/memhog"), "./testdata/memhog")
	build.Dir = "../proc"
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build memhog: %v: %s", err, out)
	}
	e := newEngine(b)
	cr, err := e.CreateSandbox(ctx, "big", CreateOptions{Base: base})
	must(b, err)
	_, err = e.Processes().Exec(ctx, "big", []string{"/bin/memhog", strconv.Itoa(mib), "/tmp/ready"}, ExecOptions{Detach: true})
	must(b, err)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := os.Stat(filepath.Join(cr.Root, "tmp/ready")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("memhog never became ready")
		}
		time.Sleep(100 * time.Millisecond)
	}
	first, err := e.Checkpoint(ctx, "big", CheckpointOptions{})
	must(b, err)
	if first.Class != delta.ClassFull && first.Class != delta.ClassProcess {
		b.Fatalf("first checkpoint classed %s", first.Class)
	}
	var redumpNew, pauses, frozen, restores time.Duration
	var newBytes int64
	for b.Loop() {
		// Wake the process without changing its memory (the Go runtime
		// handles SIGURG and sleeps again): a process change whose image is
		// the same bytes, which the content store should mostly recognise.
		sh(b, e, "big", "kill -URG $(pidof memhog)")
		r, err := e.Checkpoint(ctx, "big", CheckpointOptions{})
		must(b, err)
		if r.Class == delta.ClassSkip {
			b.Fatal("the woken process was not dumped again")
		}
		redumpNew += r.Duration
		pauses += time.Duration(r.Stats.PauseNs)
		if r.ProcDump == nil {
			b.Fatal("a process checkpoint without CRIU's statistics")
		}
		frozen += time.Duration(r.ProcDump.FrozenNs)
		newBytes += r.Stats.BytesNew
		start := time.Now()
		_, err = e.Rollback(ctx, "big", mustRef(first.ID.String()), RollbackOptions{})
		must(b, err)
		restores += time.Since(start)
	}
	n := float64(b.N)
	b.ReportMetric(float64(mib), "rss-MiB")
	b.ReportMetric(float64(first.Stats.PauseNs)/1e6, "first-pause-ms")
	b.ReportMetric(float64(first.Stats.BytesNew)/(1<<20), "image-stored-MiB")
	b.ReportMetric(float64(pauses.Milliseconds())/n, "redump-pause-ms")
	b.ReportMetric(float64(frozen.Milliseconds())/n, "redump-criu-frozen-ms") // CRIU's own share of the pause
	b.ReportMetric(float64(newBytes)/n/(1<<10), "redump-new-KiB")
	b.ReportMetric(100*float64(newBytes)/n/float64(first.Stats.BytesNew), "redump-new-%")
	b.ReportMetric(float64(redumpNew.Milliseconds())/n, "redump-checkpoint-ms")
	b.ReportMetric(float64(restores.Milliseconds())/n, "rollback-with-processes-ms")
}

// BenchmarkSkipTurnWithContainer measures a turn that changed nothing, as
// the CLI runs it: open the home, checkpoint (class skip), close. With a
// container running, every fresh Engine needs the process runtime; the
// host probe of runc and CRIU is cached in the home, keyed by the binaries'
// identity. Baselines in the same run: the same turn with the cache removed
// before each turn (the probe runs every time, as before the cache), and a
// sandbox without a container.
func BenchmarkSkipTurnWithContainer(b *testing.B) {
	requireProcs(b)
	ctx := context.Background()
	base := busyboxBase(b)
	setup := func(b *testing.B, container bool) string {
		home := filepath.Join(b.TempDir(), "home")
		e, err := Open(ctx, Options{Home: home})
		must(b, err)
		_, err = e.CreateSandbox(ctx, "s", CreateOptions{Base: base})
		must(b, err)
		if container {
			_, err = e.Processes().Exec(ctx, "s", []string{"sh", "-c", "while true; do sleep 3600; done"}, ExecOptions{Detach: true})
			must(b, err)
		}
		_, err = e.Checkpoint(ctx, "s", CheckpointOptions{})
		must(b, err)
		must(b, e.Close())
		b.Cleanup(func() {
			e, err := Open(ctx, Options{Home: home})
			if err == nil {
				e.RemoveSandbox(ctx, "s")
				e.Close()
			}
		})
		return home
	}
	turn := func(b *testing.B, home string) {
		e, err := Open(ctx, Options{Home: home})
		must(b, err)
		r, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
		must(b, err)
		if r.Class != delta.ClassSkip {
			b.Fatalf("idle turn classed %s (%s)", r.Class, r.ProcessChange)
		}
		must(b, e.Close())
	}
	for _, c := range []struct {
		name      string
		container bool
		cached    bool
	}{{"no-container", false, true}, {"container-uncached-probe", true, false}, {"container-cached-probe", true, true}} {
		b.Run(c.name, func(b *testing.B) {
			home := setup(b, c.container)
			cache := filepath.Join(home, "proc", "host-probe.json")
			for b.Loop() {
				if !c.cached {
					os.Remove(cache)
				}
				turn(b, home)
			}
		})
	}
}
