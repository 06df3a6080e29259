package engine

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/bench/monorepo"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/benchenv"
	"github.com/turnsnap/turnsnap/internal/btrfstest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"golang.org/x/sys/unix"
)

// bigRepo generates issue 27's big repository (150,000 files, 1.4 GiB;
// TURNSNAP_BENCH_SMALL: 3,000 files, 30 MiB) into a temp dir of b.
func bigRepo(b *testing.B) (string, *monorepo.Tree) {
	b.Helper()
	dir := filepath.Join(b.TempDir(), "repo")
	tr, err := monorepo.Generate(context.Background(), dir, monorepo.Options{Seed: 27,
		Files: benchenv.Size(monorepo.FullFiles, monorepo.SmallFiles), Bytes: int64(benchenv.Size(monorepo.FullBytes, monorepo.SmallBytes))})
	must(b, err)
	return dir, tr
}

// writeBack flushes every dirty page before a timed run, so that no run
// pays for the writeback of the one before it.
func writeBack() { unix.Sync() }

// resticBackup times `restic backup dir` into repo (initialised before,
// untimed); a second call on the same repo is restic's incremental backup.
// Restic keeps its cache beside the repository, as a user's would be.
func resticBackup(b *testing.B, repo, dir string) (wall, cpu time.Duration) {
	b.Helper()
	if _, err := exec.LookPath("restic"); err != nil {
		testenv.Missing(b, "restic", "the big-repository benchmarks' baseline; scripts/deps.d/60-restic.sh installs it")
	}
	run := func(args ...string) time.Duration {
		c := exec.Command("restic", append([]string{"-q", "--cache-dir", repo + ".cache"}, args...)...)
		c.Env = append(os.Environ(), "RESTIC_PASSWORD=bench", "RESTIC_REPOSITORY="+repo)
		if out, err := c.CombinedOutput(); err != nil {
			b.Fatalf("restic %v: %v\n%s", args, err, out)
		}
		return c.ProcessState.UserTime() + c.ProcessState.SystemTime()
	}
	if _, err := os.Stat(filepath.Join(repo, "config")); err != nil {
		run("init")
	}
	writeBack()
	start := time.Now()
	cpu = run("backup", dir)
	return time.Since(start), cpu
}

// tarZstd times `tar -C dir -cf - . | zstd -T0` into a file: the
// archive-and-compress baseline (what a snapshot by tarball costs).
func tarZstd(b *testing.B, dir, out string) (wall, cpu time.Duration) {
	b.Helper()
	if _, err := exec.LookPath("zstd"); err != nil {
		testenv.Missing(b, "zstd", "the big-repository benchmark's tar baseline; scripts/deps.d/60-restic.sh installs it")
	}
	writeBack()
	start := time.Now()
	c := exec.Command("sh", "-c", `tar -C "$1" -cf - . | zstd -q -T0 -o "$2"`, "sh", dir, out)
	if o, err := c.CombinedOutput(); err != nil {
		b.Fatalf("tar | zstd: %v\n%s", err, o)
	}
	// The shell's usage includes tar's and zstd's, which it waited for.
	return time.Since(start), c.ProcessState.UserTime() + c.ProcessState.SystemTime()
}

// cpuTime is the user and system CPU this process has used.
func cpuTime() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(unix.TimevalToNsec(ru.Utime) + unix.TimevalToNsec(ru.Stime))
}

// BenchmarkScaleBigRepoCreate is issue 27's first figure: `sandbox create`
// of the big repository (its import into the store as a base, the base
// made ready on this host, the sandbox mounted) on overlay and on a loop
// btrfs, each on a fresh home, against `restic backup` of the same tree
// into a fresh repository and `tar | zstd -T0` of it, in the same run. The
// tree is in the page cache for all four (it was just written). Reported:
// seconds of each, create's ratio to restic's (goal: at most 1.0x), the
// load at start and end.
//
// Profile the import: add -cpuprofile; the create runs in this process.
func BenchmarkScaleBigRepoCreate(b *testing.B) {
	ctx := context.Background()
	tree, _ := bigRepo(b)
	pool := btrfstest.Pool(b)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		load0 := benchenv.Load1(b)
		tmp := b.TempDir()
		restic, resticCPU := resticBackup(b, filepath.Join(tmp, "restic"), tree)
		tz, tzCPU := tarZstd(b, tree, filepath.Join(tmp, "tree.tar.zst"))
		create := func(name string, opts CreateOptions) (wall, cpu time.Duration) {
			e := openEngineOracle(b, filepath.Join(tmp, name+"-home"), false)
			writeBack()
			b.StartTimer()
			start, cpu0 := time.Now(), cpuTime()
			cr, err := e.CreateSandbox(ctx, "big", opts)
			el, cpu := time.Since(start), cpuTime()-cpu0
			b.StopTimer()
			must(b, err)
			if cr.BaseStats.FilesRead == 0 {
				b.Fatalf("%s: create read no file", name)
			}
			must(b, e.RemoveSandbox(ctx, "big"))
			return el, cpu
		}
		ov, ovCPU := create("overlay", CreateOptions{Base: tree})
		btPool := filepath.Join(pool, strconv.Itoa(i))
		must(b, os.MkdirAll(btPool, 0o755))
		bt, btCPU := create("btrfs", btrfsOpts(btPool, tree))
		b.ReportMetric(restic.Seconds(), "restic_s")
		b.ReportMetric(tz.Seconds(), "tar_zstd_s")
		b.ReportMetric(ov.Seconds(), "create_overlay_s")
		b.ReportMetric(bt.Seconds(), "create_btrfs_s")
		b.ReportMetric(ov.Seconds()/restic.Seconds(), "overlay_x_restic")
		b.ReportMetric(bt.Seconds()/restic.Seconds(), "btrfs_x_restic")
		b.ReportMetric(tz.Seconds()/restic.Seconds(), "tar_zstd_x_restic")
		// CPU seconds: on a shared machine whose load moves during the run,
		// the wall-clock ratios above move with it; these do much less.
		b.ReportMetric(resticCPU.Seconds(), "restic_cpu_s")
		b.ReportMetric(tzCPU.Seconds(), "tar_zstd_cpu_s")
		b.ReportMetric(ovCPU.Seconds(), "create_overlay_cpu_s")
		b.ReportMetric(btCPU.Seconds(), "create_btrfs_cpu_s")
		b.ReportMetric(ovCPU.Seconds()/resticCPU.Seconds(), "overlay_cpu_x_restic")
		b.ReportMetric(btCPU.Seconds()/resticCPU.Seconds(), "btrfs_cpu_x_restic")
		b.ReportMetric(load0, "load1_start")
		b.ReportMetric(benchenv.Load1(b), "load1_end")
	}
}

// BenchmarkScaleTenFileTurns splits the big repository's 10-file turn
// (cmd/turnsnap's BenchmarkScaleBigRepoTurns measures it through the
// daemon) by what runs beside it. The same turns, back to back, with
// change tracking on, on two homes in the same run: one freezing each
// checkpoint's layer in the background as the daemon does (bg_), one
// freezing none (none_: Options.FreezeOnBranch, whose incremental freezes
// need a kept layer this sandbox never has). Reported per setting: the
// turn's p50 and p99 and its scan's and commit's (ms), and the entries a
// turn scanned; the load at start and end.
func BenchmarkScaleTenFileTurns(b *testing.B) {
	testenv.RequireRoot(b)
	ctx := context.Background()
	tree, tr := bigRepo(b)
	turns := benchenv.Size(1000, 20)
	run := func(prefix string, onBranch bool) {
		e, err := Open(ctx, Options{Home: filepath.Join(b.TempDir(), "home"), TrackChanges: true, FreezeOnBranch: onBranch})
		must(b, err)
		defer e.Close()
		cr, err := e.CreateSandbox(ctx, "big", CreateOptions{Base: tree})
		must(b, err)
		defer func() { must(b, e.RemoveSandbox(ctx, "big")) }()
		// The first turn walks the root once; the turns measured are the
		// steady state after it.
		must(b, tr.EditSources(cr.Root, 0, 10))
		_, err = e.Checkpoint(ctx, "big", CheckpointOptions{})
		must(b, err)
		var total, scan, commit []float64
		var entries int64
		b.StartTimer()
		for turn := range turns {
			must(b, tr.EditSources(cr.Root, turn+1, 10))
			r, err := e.Checkpoint(ctx, "big", CheckpointOptions{})
			must(b, err)
			if r.Class != delta.ClassFS {
				b.Fatalf("turn %d classed %s, want fs", turn+1, r.Class)
			}
			total = append(total, msOf(r.Duration))
			scan = append(scan, msOf(r.Phases.Scan))
			commit = append(commit, msOf(r.Phases.Commit))
			entries += int64(r.Stats.Entries)
		}
		b.StopTimer()
		for name, v := range map[string][]float64{"turn": total, "scan": scan, "commit": commit} {
			slices.Sort(v)
			b.ReportMetric(v[len(v)/2], prefix+name+"_p50_ms")
			b.ReportMetric(v[len(v)*99/100], prefix+name+"_p99_ms")
		}
		b.ReportMetric(float64(entries)/float64(turns), prefix+"entries/turn")
	}
	b.StopTimer()
	for range b.N {
		load0 := benchenv.Load1(b)
		run("bg_", false)
		run("none_", true)
		b.ReportMetric(load0, "load1_start")
		b.ReportMetric(benchenv.Load1(b), "load1_end")
	}
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
