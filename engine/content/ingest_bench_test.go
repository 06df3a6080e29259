package content

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"golang.org/x/sys/unix"
)

// benchSmall is make test's switch for quick benchmark runs.
func benchSmall() bool { return os.Getenv("TURNSNAP_BENCH_SMALL") == "1" }

// BenchmarkIngest is the large turn: about 1 GB, 600 MB of random
// files (10 MB each) and 400 MB of source-like text (1 MB each), scanned,
// chunked, hashed, compressed and written into packs of a local store,
// then published to the catalog. Three sub-benchmarks on the same data in
// the same run: the pipeline (GOMAXPROCS workers), a single worker (the
// serial path), and restic 0.14 (`restic backup` into a local repository,
// its default zstd compression). "pipeline" reports its ratio to both.
// TURNSNAP_BENCH_SMALL=1 uses about 20 MB.
func BenchmarkIngest(b *testing.B) {
	dir := b.TempDir()
	random, text, fileSize := int64(600e6), int64(400e6), int64(10e6)
	if benchSmall() {
		random, text, fileSize = 12e6, 8e6, 2e6
	}
	total := writeIngestData(b, dir, 42, random, text, fileSize)
	rate := map[string]float64{}
	run := func(name string, once func(b *testing.B) time.Duration) {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(total)
			var spent time.Duration
			cpu0 := cpuTime()
			for range b.N {
				spent += once(b)
			}
			rate[name] = float64(total) * float64(b.N) / spent.Seconds() / (1 << 20)
			b.ReportMetric(rate[name], "MiB/s")
			if name != "restic" {
				// CPU of this process per GB (setup included): a pipeline that
				// costs more CPU than the serial path shows here, whatever the
				// machine's load does to the wall clock.
				b.ReportMetric((cpuTime()-cpu0).Seconds()/float64(b.N)/(float64(total)/1e9), "cpu-s/GB")
			}
			if name == "pipeline" {
				b.ReportMetric(rate[name]/rate["single-worker"], "x-single")
				if rate["restic"] > 0 {
					b.ReportMetric(rate[name]/rate["restic"], "x-restic")
				}
			}
		})
	}
	ours := func(workers int) func(b *testing.B) time.Duration {
		return func(b *testing.B) time.Duration {
			b.StopTimer()
			r := newRepoTB(b)
			settle()
			b.StartTimer()
			start := time.Now()
			ingest(b, r, dir, workers)
			return time.Since(start)
		}
	}
	run("single-worker", ours(1))
	run("restic", func(b *testing.B) time.Duration {
		if _, err := exec.LookPath("restic"); err != nil {
			testenv.Missing(b, "restic", "the ingest benchmark's baseline; scripts/deps.d/60-restic.sh installs it")
		}
		b.StopTimer()
		repo := filepath.Join(b.TempDir(), "restic")
		env := append(os.Environ(), "RESTIC_PASSWORD=bench", "RESTIC_REPOSITORY="+repo)
		cmd := func(args ...string) {
			c := exec.Command("restic", append([]string{"--no-cache", "-q"}, args...)...)
			c.Env = env
			if out, err := c.CombinedOutput(); err != nil {
				b.Fatalf("restic %v: %v\n%s", args, err, out)
			}
		}
		cmd("init")
		settle()
		b.StartTimer()
		start := time.Now()
		cmd("backup", dir)
		return time.Since(start)
	})
	run("pipeline", ours(0))
}

// settle writes back every dirty page before a timed run, so that no run
// pays for the writeback of the one before it (restic's repository, our
// packs: the local store syncs each pack it writes).
func settle() { unix.Sync() }

// cpuTime is the user and system CPU this process has used.
func cpuTime() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(unix.TimevalToNsec(ru.Utime) + unix.TimevalToNsec(ru.Stime))
}

// BenchmarkIngestSmall is a small turn: 10 files of 4 to 40 KiB. It stays
// under fstree.PipelineThreshold, so "pipeline" starts no goroutine and
// must cost what "single-worker" costs. Each iteration scans into a fresh
// Op (nothing deduplicates against the last), without publishing.
func BenchmarkIngestSmall(b *testing.B) {
	dir := b.TempDir()
	var total int64
	for i := range 10 {
		// Alternately random and text, 4 KiB to 40 KiB: one file each.
		size := int64(4 << 10 * (i + 1))
		random, text := size, int64(0)
		if i%2 == 1 {
			random, text = 0, size
		}
		total += writeIngestData(b, filepath.Join(dir, string(rune('a'+i))), uint64(i), random, text, 10*size)
	}
	r := newRepoTB(b)
	for _, w := range []struct {
		name    string
		workers int
	}{{"single-worker", 1}, {"pipeline", 0}} {
		b.Run(w.name, func(b *testing.B) {
			b.SetBytes(total)
			for b.Loop() {
				op := r.Begin()
				if _, err := fstree.Scan(context.Background(), dir, fstree.ScanOptions{Saver: op, Workers: w.workers}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
