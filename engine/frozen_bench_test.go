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
	"github.com/turnsnap/turnsnap/internal/benchenv"
	"github.com/turnsnap/turnsnap/overlay"
	"github.com/turnsnap/turnsnap/overlay/frozen"
	"golang.org/x/sys/unix"
)

// BenchmarkBranch8 is issue 13's fan-out: 8 branches of one checkpoint
// whose writable layer holds 2,000 files, 20 MB (200 files, 2 MB under
// TURNSNAP_BENCH_SMALL). Stacked branches (on the checkpoint's frozen
// layer) via BranchMany and via 8 Branch calls, against the baselines of
// the same run: materialised branches (the old path) and `cp -a` of the
// layer 8 times. It then measures the first freeze of the whole layer; the
// checkpoint call of a turn changing 10 files with its background freeze
// against no freezing at all; the freeze of such a turn, incremental
// against the full build (unchanged files cloned); and 8 branches right after a
// checkpoint (waiting for its freeze). Ratios are logged (go test -v).
func BenchmarkBranch8(b *testing.B) {
	ctx := context.Background()
	files := benchenv.Size(2000, 200)
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
	// The checkpoint's layer is frozen in the background; the stacked
	// branches below are of the frozen layer, so its first freeze (which
	// freeze-whole-layer measures) must not land in their first loop.
	e.WaitFreezes()
	ckpt := c.ID.String()
	names, err := BranchNames("br", 8)
	must(b, err)
	clean := func(b *testing.B) {
		b.StopTimer()
		for _, n := range names {
			must(b, e.RemoveSandbox(ctx, delta.SandboxName(n)))
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
		_, err := e.BranchMany(ctx, mustRef(ckpt), sandboxNames(names), BranchOptions{})
		must(b, err)
		clean(b)
	})
	run("stacked-8xBranch", func(b *testing.B) {
		for _, n := range names {
			_, err := e.Branch(ctx, mustRef(ckpt), delta.SandboxName(n), BranchOptions{})
			must(b, err)
		}
		clean(b)
	})
	run("materialised-8xBranch-baseline", func(b *testing.B) {
		for _, n := range names {
			_, err := e.Branch(ctx, mustRef(ckpt), delta.SandboxName(n), BranchOptions{Materialise: true})
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
	ob := overlayOf(e)
	cp, err := e.resolveFor(ctx, "", mustRef(ckpt))
	must(b, err)
	run("freeze-whole-layer", func(b *testing.B) {
		b.StopTimer()
		_, err := ob.Layers().Remove(cp.FSTree, func(string) bool { return false })
		must(b, err)
		ob.Layers().WaitRemovals()
		b.StartTimer()
		st, err := ob.Layers().Freeze(ctx, cp.FSTree, cr.Root, nil, e.data.repo, nil)
		must(b, err)
		if st.Copied != int64(files) {
			b.Fatalf("freeze copied %d files, want %d", st.Copied, files)
		}
	})

	i := 0
	change := func(b *testing.B) {
		for range 10 {
			p := filepath.Join(cr.Root, fmt.Sprintf("d%02d/f%05d.txt", (i%files)/100, i%files))
			must(b, os.WriteFile(p, fileBody(rng, 10000), 0o644))
			i++
		}
	}
	turn := func(b *testing.B, keep int) {
		b.StopTimer()
		e.WaitFreezes() // the previous turn's, outside the timed part
		e.config.FrozenKeep = &keep
		change(b)
		b.StartTimer()
		r, err := e.Checkpoint(ctx, "src", CheckpointOptions{})
		must(b, err)
		if r.Class != delta.ClassFS {
			b.Fatalf("turn classed %s", r.Class)
		}
	}
	// The checkpoint call with its layer frozen in the background, against
	// no freezing at all: the goal is within noise.
	for _, keep := range []int{frozen.DefaultKeep, 0} {
		name := "checkpoint-10-files-background-freeze"
		if keep == 0 {
			name = "checkpoint-10-files-no-freeze-baseline"
		}
		run(name, func(b *testing.B) { turn(b, keep) })
	}
	e.WaitFreezes()
	e.config.FrozenKeep = nil
	if f, n := per["checkpoint-10-files-background-freeze"], per["checkpoint-10-files-no-freeze-baseline"]; n > 0 {
		b.Logf("checkpoint of a 10-file turn: %v with the background freeze, %v without freezing (%.2fx)", f, n, float64(f)/float64(n))
	}

	// The freeze itself, of a 10-file turn: incremental (an unkept layer
	// changed by the names that differ) against the full build (a new
	// directory tree, every unchanged file cloned from the parent's layer:
	// a reflink, else an in-kernel copy; its later removal, not counted).
	live, err := overlay.LiveUpper(e.home.sandboxDir("src"))
	must(b, err)
	var layers []delta.ID // oldest first
	for _, t := range func() []delta.ID { ts, _ := ob.Layers().Trees(); return ts }() {
		_, err := ob.Layers().Remove(t, func(string) bool { return false })
		must(b, err)
	}
	ob.Layers().WaitRemovals()
	off := 0
	e.config.FrozenKeep = &off
	cut := func(b *testing.B) delta.ID {
		change(b)
		r, err := e.Checkpoint(ctx, "src", CheckpointOptions{})
		must(b, err)
		cp, err := e.resolveFor(ctx, "", mustRef(r.ID.String()))
		must(b, err)
		return cp.FSTree
	}
	for range 2 {
		t := cut(b)
		src := &frozen.Source{}
		if len(layers) > 0 {
			src.Tree = layers[len(layers)-1]
		}
		_, err := ob.Layers().Freeze(ctx, t, live, src, e.data.repo, nil)
		must(b, err)
		layers = append(layers, t)
	}
	freezeTurn := func(b *testing.B, incremental bool) {
		b.StopTimer()
		t := cut(b)
		// The layer's one syncfs would also wait for whatever the earlier
		// parts of this benchmark left dirty: flush that first, for both.
		unix.Sync()
		prev, old := layers[len(layers)-1], layers[len(layers)-2]
		src := &frozen.Source{Tree: prev}
		if incremental {
			src.Reuse, src.InUse = []delta.ID{old}, overlayOf(e).Keeper().InUse
		}
		b.StartTimer()
		st, err := ob.Layers().Freeze(ctx, t, live, src, e.data.repo, nil)
		must(b, err)
		b.StopTimer()
		if st.Reused.IsZero() == incremental {
			b.Fatalf("freeze reused %s, incremental %v", st.Reused.Short(), incremental)
		}
		if !incremental {
			_, err := ob.Layers().Remove(old, func(string) bool { return false })
			must(b, err)
			ob.Layers().WaitRemovals()
		}
		layers = append(layers[1:], t)
		b.StartTimer()
	}
	run("freeze-10-files-incremental", func(b *testing.B) { freezeTurn(b, true) })
	run("freeze-10-files-full-build-baseline", func(b *testing.B) { freezeTurn(b, false) })
	if inc, full := per["freeze-10-files-incremental"], per["freeze-10-files-full-build-baseline"]; inc > 0 {
		b.Logf("freeze of a 10-file turn: incremental %v, full build %v (%.1fx)", inc, full, float64(full)/float64(inc))
	}
	e.config.FrozenKeep = nil

	// 8 branches right after a checkpoint: BranchMany waits for (or
	// builds) the layer being frozen, then stacks; against BranchMany of a
	// layer frozen long before (stacked-BranchMany above).
	run("BranchMany-right-after-checkpoint", func(b *testing.B) {
		b.StopTimer()
		e.WaitFreezes()
		change(b)
		r, err := e.Checkpoint(ctx, "src", CheckpointOptions{})
		must(b, err)
		waited := overlayOf(e).Keeper().Waited()
		b.StartTimer()
		rs, err := e.BranchMany(ctx, mustRef(r.ID.String()), sandboxNames(names), BranchOptions{})
		must(b, err)
		b.StopTimer()
		if overlay.FrozenUser(e.home.sandboxDir(delta.SandboxName(rs[0].Sandbox))) == "" {
			b.Fatal("a branch right after its checkpoint does not stack")
		}
		if overlayOf(e).Keeper().Waited() == waited {
			b.Log("the checkpoint's freeze was done before the branches came")
		}
		b.StartTimer()
		clean(b)
	})
	if a, s := per["BranchMany-right-after-checkpoint"], per["stacked-BranchMany"]; s > 0 {
		b.Logf("8 branches right after a checkpoint: %v, of a layer frozen before: %v (%.2fx)", a, s, float64(a)/float64(s))
	}
}

// BenchmarkFrozenKeepSet is frozen-layer retention's pass (run after each
// background freeze) over 16 sandboxes two checkpoints deep: answered from
// the memo of lines by head (memo) against decoding every head's line
// (cold, the memo emptied before each pass), in the same run.
func BenchmarkFrozenKeepSet(b *testing.B) {
	ctx := context.Background()
	e := newEngine(b)
	base := b.TempDir()
	write(b, filepath.Join(base, "a"), "base\n")
	for i := range 16 {
		name := fmt.Sprintf("s%d", i)
		cr, err := e.CreateSandbox(ctx, delta.SandboxName(name), CreateOptions{Base: base})
		if err != nil {
			b.Fatal(err)
		}
		for turn := range 2 {
			write(b, filepath.Join(cr.Root, "f"), fmt.Sprintf("%s turn %d\n", name, turn))
			if _, err := e.Checkpoint(ctx, delta.SandboxName(name), CheckpointOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	e.WaitFreezes()
	for _, memo := range []bool{false, true} {
		b.Run(map[bool]string{false: "cold", true: "memo"}[memo], func(b *testing.B) {
			for b.Loop() {
				if !memo {
					overlayOf(e).Keeper().ForgetLines()
				}
				keep, err := overlayOf(e).Keeper().KeepSet(ctx)
				if err != nil || len(keep) != 32 {
					b.Fatalf("keep set of %d trees: %v", len(keep), err)
				}
			}
		})
	}
}
