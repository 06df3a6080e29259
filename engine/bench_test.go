package engine

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/benchenv"
)

// Benchmark sandbox shape: the issue asks for at least 20,000 base files and
// 2,000 changed files. TURNSNAP_BENCH_SMALL (set by `make test`, which runs
// each benchmark once so it cannot rot) shrinks it.
func benchShape() (baseFiles, changed int) {
	if benchenv.Small() {
		return 500, 50
	}
	return 20000, 2000
}

// fileBody returns size bytes that compress like source code.
func fileBody(rng *rand.Rand, size int) []byte {
	words := []string{"func ", "return ", "err ", "nil ", "ctx ", "if ", "{\n", "}\n", "for ", "range "}
	b := make([]byte, 0, size+16)
	for len(b) < size {
		b = append(b, words[rng.Intn(len(words))]...)
		if rng.Intn(8) == 0 {
			b = fmt.Appendf(b, "v%d ", rng.Intn(1e6))
		}
	}
	return b[:size]
}

// benchSandbox creates a sandbox of the benchmark shape whose last
// checkpoint holds the changed files, with the scan cache settled.
func benchSandbox(b *testing.B) (*Engine, string, int) {
	b.Helper()
	ctx := context.Background()
	nBase, nChanged := benchShape()
	rng := rand.New(rand.NewSource(1))
	base := b.TempDir()
	for i := range nBase {
		p := filepath.Join(base, fmt.Sprintf("pkg%03d/sub%d/f%05d.go", i/200, i%4, i))
		must(b, os.MkdirAll(filepath.Dir(p), 0o755))
		must(b, os.WriteFile(p, fileBody(rng, 512+rng.Intn(3584)), 0o644))
	}
	e := newEngine(b)
	cr, err := e.CreateSandbox(ctx, "bench", CreateOptions{Base: base})
	must(b, err)
	var upperBytes int
	for i := range nChanged {
		var p string
		if i%2 == 0 { // modify a base file (copy-up)
			p = filepath.Join(cr.Root, fmt.Sprintf("pkg%03d/sub%d/f%05d.go", i/200, i%4, i))
		} else { // a new file
			p = filepath.Join(cr.Root, fmt.Sprintf("new%02d/n%05d.txt", i/200, i))
		}
		must(b, os.MkdirAll(filepath.Dir(p), 0o755))
		body := fileBody(rng, 512+rng.Intn(3584))
		upperBytes += len(body)
		must(b, os.WriteFile(p, body, 0o644))
	}
	_, err = e.Checkpoint(ctx, "bench", CheckpointOptions{})
	must(b, err)
	settle()
	_, err = e.Checkpoint(ctx, "bench", CheckpointOptions{}) // settles racy cache entries
	must(b, err)
	return e, cr.Root, upperBytes
}

// BenchmarkCheckpoint measures turn boundaries on one sandbox of the
// benchmark shape. full-reread is the baseline: the same no-op turn with the
// scan cache dropped, i.e. what a checkpoint costs when it must re-read and
// re-hash every file of the writable layer.
func BenchmarkCheckpoint(b *testing.B) {
	ctx := context.Background()
	e, root, upperBytes := benchSandbox(b)
	b.Run("noop", func(b *testing.B) {
		var read int64
		for b.Loop() {
			r, err := e.Checkpoint(ctx, "bench", CheckpointOptions{})
			must(b, err)
			if r.Class != delta.ClassSkip {
				b.Fatalf("no-op classed %s", r.Class)
			}
			read += r.Stats.FilesRead
		}
		b.ReportMetric(float64(read)/float64(b.N), "files-read/op")
	})
	b.Run("full-reread-baseline", func(b *testing.B) {
		b.SetBytes(int64(upperBytes))
		cache := filepath.Join(e.home.sandboxDir("bench"), "current")
		for b.Loop() {
			b.StopTimer()
			gen, _ := os.Readlink(cache)
			os.Remove(filepath.Join(e.home.sandboxDir("bench"), gen, "scan.cache"))
			b.StartTimer()
			r, err := e.Checkpoint(ctx, "bench", CheckpointOptions{})
			must(b, err)
			if r.Class != delta.ClassSkip {
				b.Fatalf("baseline classed %s", r.Class)
			}
		}
	})
	rng := rand.New(rand.NewSource(2))
	b.Run("fs-10-files", func(b *testing.B) {
		i := 0
		var newBytes int64
		for b.Loop() {
			b.StopTimer()
			for range 10 {
				p := filepath.Join(root, fmt.Sprintf("new%02d/n%05d.txt", 0, 2*(i%100)+1))
				must(b, os.WriteFile(p, fileBody(rng, 2048), 0o644))
				i++
			}
			b.StartTimer()
			r, err := e.Checkpoint(ctx, "bench", CheckpointOptions{})
			must(b, err)
			if r.Class != delta.ClassFS {
				b.Fatalf("10-file turn classed %s", r.Class)
			}
			newBytes += r.Stats.BytesNew
		}
		b.ReportMetric(float64(newBytes)/float64(b.N), "new-bytes/op")
	})
	b.Run("rollback", func(b *testing.B) {
		log, err := e.History().Log(ctx, "bench")
		must(b, err)
		target := log[len(log)-2].ID.String() // the checkpoint with all changed files
		for b.Loop() {
			if _, err := e.Rollback(ctx, "bench", mustRef(target), RollbackOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	// A no-op turn after a chmod to the same mode of as many base files as
	// the turn above changed: overlay copied them up, so the state key
	// differs from the head's and every turn compares the merged states
	// (delta.Changed) to find it is still a skip. Compare with noop.
	_, nChanged := benchShape()
	for i := 1; i < 2*nChanged; i += 2 {
		must(b, os.Chmod(filepath.Join(root, fmt.Sprintf("pkg%03d/sub%d/f%05d.go", i/200, i%4, i)), 0o644))
	}
	settle()
	b.Run("noop-after-copyups", func(b *testing.B) {
		for b.Loop() {
			r, err := e.Checkpoint(ctx, "bench", CheckpointOptions{})
			must(b, err)
			if r.Class != delta.ClassSkip {
				b.Fatalf("copy-up-only turn classed %s", r.Class)
			}
		}
	})
}

// BenchmarkScanUpper is the scan phase alone, warm cache against cold.
func BenchmarkScanUpper(b *testing.B) {
	ctx := context.Background()
	e, _, upperBytes := benchSandbox(b)
	st, err := e.loadSandbox(ctx, "bench")
	must(b, err)
	b.Run("cached", func(b *testing.B) {
		for b.Loop() {
			if _, err := st.root.Scan(ctx, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("uncached", func(b *testing.B) {
		b.SetBytes(int64(upperBytes))
		dir := e.home.sandboxDir("bench")
		gen, err := os.Readlink(filepath.Join(dir, "current"))
		must(b, err)
		for b.Loop() {
			b.StopTimer()
			os.Remove(filepath.Join(dir, gen, "scan.cache"))
			b.StartTimer()
			if _, err := st.root.Scan(ctx, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkSmallTurn is a 10-file turn on a small sandbox, tracked as a
// daemon tracks it, each after the previous turn's background freeze has
// finished: the turn's own cost, commit included (three objects and one
// catalog transaction; four and two before small turns shared them).
// Reported: medians of the whole call and of its commit phase, and the
// catalog transactions per turn.
func BenchmarkSmallTurn(b *testing.B) {
	ctx := context.Background()
	e := newEngine(b)
	overlayOf(e).SetTracking(true, e.log)
	cr := smallSandbox(b, e, "s")
	var commitStart time.Time
	e.opts.AtPhase = func(p string) {
		if p == PhaseCommit {
			commitStart = time.Now()
		}
	}
	var calls, commits []time.Duration
	var txs int64
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		for f := range 10 {
			write(b, filepath.Join(cr.Root, "src", fmt.Sprintf("f%02d.txt", f)), fmt.Sprintf("turn %d file %d\n%01000d\n", i, f, i))
		}
		e.WaitFreezes()
		tx0 := e.cat.Updates()
		b.StartTimer()
		start := time.Now()
		r, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
		end := time.Now()
		must(b, err)
		if r.Class != delta.ClassFS {
			b.Fatalf("turn %d classed %s", i, r.Class)
		}
		b.StopTimer()
		txs += e.cat.Updates() - tx0
		calls = append(calls, end.Sub(start))
		commits = append(commits, end.Sub(commitStart))
		b.StartTimer()
	}
	median := func(ds []time.Duration) float64 {
		slices.Sort(ds)
		return float64(ds[len(ds)/2].Nanoseconds()) / 1e6
	}
	b.ReportMetric(median(calls), "median-ms")
	b.ReportMetric(median(commits), "commit-median-ms")
	b.ReportMetric(float64(txs)/float64(len(calls)), "catalog-tx/op")
}
