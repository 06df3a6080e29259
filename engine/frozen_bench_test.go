package engine

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
)

// BenchmarkBranch8 is issue 13's fan-out: 8 branches of one checkpoint
// whose writable layer holds 2,000 files, 20 MB (200 files, 2 MB under
// TURNSNAP_BENCH_SMALL). Stacked branches (on the checkpoint's frozen
// layer) via BranchMany and via 8 Branch calls, against the baselines of
// the same run: materialised branches (the old path) and `cp -a` of the
// layer 8 times. It then measures the checkpoint call with and without
// freezing the layer (a turn changing 10 files of it), and the first freeze
// of the whole layer. Ratios are logged (go test -v).
func BenchmarkBranch8(b *testing.B) {
	ctx := context.Background()
	files := scaleN(2000, 200)
	rng := rand.New(rand.NewSource(3))
	base := b.TempDir()
	for i := range 20 {
		must(b, os.WriteFile(filepath.Join(base, fmt.Sprintf("base%02d", i)), fileBody(rng, 1024), 0o644))
	}
	e := newEngine(b)
	cr, err := e.CreateSandbox(ctx, "src", CreateOptions{Base: base})
	must(b, err)
	for i := range files {
		p := filepath.Join(cr.Root, fmt.Sprintf("d%02d/f%05d.txt", i/100, i))
		must(b, os.MkdirAll(filepath.Dir(p), 0o755))
		must(b, os.WriteFile(p, fileBody(rng, 10000), 0o644))
	}
	c, err := e.Checkpoint(ctx, "src", CheckpointOptions{})
	must(b, err)
	ckpt := c.ID.String()
	names, err := BranchNames("br", 8)
	must(b, err)
	clean := func(b *testing.B) {
		b.StopTimer()
		for _, n := range names {
			must(b, e.RemoveSandbox(ctx, n))
		}
		b.StartTimer()
	}
	per := map[string]time.Duration{}
	run := func(name string, fn func(b *testing.B)) {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				fn(b)
			}
			per[name] = b.Elapsed() / time.Duration(b.N) // the timed part only
		})
	}
	run("stacked-BranchMany", func(b *testing.B) {
		_, err := e.BranchMany(ctx, ckpt, names, BranchOptions{})
		must(b, err)
		clean(b)
	})
	run("stacked-8xBranch", func(b *testing.B) {
		for _, n := range names {
			_, err := e.Branch(ctx, ckpt, n, BranchOptions{})
			must(b, err)
		}
		clean(b)
	})
	run("materialised-8xBranch-baseline", func(b *testing.B) {
		for _, n := range names {
			_, err := e.Branch(ctx, ckpt, n, BranchOptions{Materialise: true})
			must(b, err)
		}
		clean(b)
	})
	gen, err := os.Readlink(filepath.Join(e.home.sandboxDir("src"), "current"))
	must(b, err)
	upper := filepath.Join(e.home.sandboxDir("src"), gen, "upper")
	run("cp-a-x8-baseline", func(b *testing.B) {
		dst := b.TempDir()
		for i := range 8 {
			if out, err := exec.Command("cp", "-a", upper, filepath.Join(dst, fmt.Sprint(i))).CombinedOutput(); err != nil {
				b.Fatalf("cp -a: %v: %s", err, out)
			}
		}
		b.StopTimer()
		os.RemoveAll(dst)
		b.StartTimer()
	})
	if m, s := per["materialised-8xBranch-baseline"], per["stacked-BranchMany"]; s > 0 {
		s8 := per["stacked-8xBranch"]
		b.Logf("8 branches: BranchMany %v, 8 Branch %v; materialised %v (%.0fx BranchMany, %.0fx 8 Branch), cp -a x8 %v (%.0fx, %.0fx)",
			s, s8, m, float64(m)/float64(s), float64(m)/float64(s8), per["cp-a-x8-baseline"],
			float64(per["cp-a-x8-baseline"])/float64(s), float64(per["cp-a-x8-baseline"])/float64(s8))
	}

	// The first freeze of a layer has no layer to link from: every file is
	// copied from the live root and verified.
	ob := e.overlayBackend()
	cp, err := e.resolve(ctx, ckpt)
	must(b, err)
	run("freeze-whole-layer", func(b *testing.B) {
		b.StopTimer()
		_, err := ob.RemoveFrozen(cp.FSTree, func(string) bool { return false })
		must(b, err)
		ob.WaitRemovals()
		b.StartTimer()
		st, err := ob.Freeze(ctx, cp.FSTree, cr.Root, nil, e.repo, nil)
		must(b, err)
		if st.Copied != int64(files) {
			b.Fatalf("freeze copied %d files, want %d", st.Copied, files)
		}
	})

	i := 0
	turn := func(b *testing.B, keep int) time.Duration {
		b.StopTimer()
		e.config.FrozenKeep = &keep
		for range 10 {
			p := filepath.Join(cr.Root, fmt.Sprintf("d%02d/f%05d.txt", (i%files)/100, i%files))
			must(b, os.WriteFile(p, fileBody(rng, 10000), 0o644))
			i++
		}
		b.StartTimer()
		r, err := e.Checkpoint(ctx, "src", CheckpointOptions{})
		must(b, err)
		if r.Class != delta.ClassFS {
			b.Fatalf("turn classed %s", r.Class)
		}
		return r.FreezeDuration
	}
	for _, keep := range []int{DefaultFrozenKeep, 0} {
		name := "checkpoint-10-files-frozen"
		if keep == 0 {
			name = "checkpoint-10-files-no-freeze-baseline"
		}
		run(name, func(b *testing.B) {
			d := turn(b, keep)
			b.ReportMetric(float64(d.Microseconds())/1000, "freeze-ms/op")
		})
	}
	e.config.FrozenKeep = nil
	if f, n := per["checkpoint-10-files-frozen"], per["checkpoint-10-files-no-freeze-baseline"]; n > 0 {
		b.Logf("checkpoint of a 10-file turn: %v with freezing, %v without (%.2fx)", f, n, float64(f)/float64(n))
	}
}
