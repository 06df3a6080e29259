package proc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/benchenv"

	"golang.org/x/sys/unix"

	"github.com/turnsnap/turnsnap/proc/criu"
)

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// bigProc is a container holding memhog (MiB of pseudo-random memory,
// half of it rewritten on demand) and a busybox httpd (the dev server).
type bigProc struct {
	rt      *Runtime
	id      string
	rootfs  string
	hog     int // memhog's host pid
	dirties int
}

func startBigProc(b *testing.B, ctx context.Context, rt *Runtime, mib int) *bigProc {
	rootfs := busyboxRootfs(b)
	buildMemhog(b, rootfs)
	if err := os.WriteFile(filepath.Join(rootfs, "www", "index.html"), []byte("dev server\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	p := &bigProc{rt: rt, rootfs: rootfs, id: startKeeper(b, rt, rootfs)}
	for _, argv := range [][]string{{"httpd", "-f", "-p", "8080", "-h", "/www"}, {"/bin/memhog", strconv.Itoa(mib), "/tmp/ready"}} {
		if _, err := rt.ExecDetached(ctx, p.id, argv, DetachOptions{Log: "/tmp/" + filepath.Base(argv[0]) + ".log"}); err != nil {
			b.Fatal(err)
		}
	}
	waitFor(b, 5*time.Minute, "memhog to fill its memory", func() bool {
		_, err := os.Stat(filepath.Join(rootfs, "tmp", "ready"))
		return err == nil
	})
	set, err := rt.Snapshot(ctx, p.id)
	if err != nil {
		b.Fatal(err)
	}
	for _, pr := range set.Procs {
		if strings.Contains(strings.Join(pr.Cmdline, " "), "memhog") {
			p.hog = pr.HostPID
		}
	}
	if p.hog == 0 || len(set.Procs) != 2 {
		b.Fatalf("processes: %+v", set.Procs)
	}
	return p
}

// dirty has memhog rewrite half its memory and waits until it has.
func (p *bigProc) dirty(b *testing.B) {
	p.dirties++
	if err := unix.Kill(p.hog, unix.SIGUSR1); err != nil {
		b.Fatal(err)
	}
	waitFor(b, 5*time.Minute, "memhog to dirty half its memory", func() bool {
		n, ok := readInt(filepath.Join(p.rootfs, "tmp", "ready.dirtied"))
		return ok && n == p.dirties
	})
}

// cut is turnsnap's process checkpoint as engine/procs runs it: runc pause
// (the consistent cut), Checkpoint of the paused container, runc resume.
// It returns the image's metadata and each phase's time.
func cut(b *testing.B, ctx context.Context, rt *Runtime, id, img string) (ImageMeta, cutPhases) {
	var ph cutPhases
	t0 := time.Now()
	if err := rt.Pause(ctx, id); err != nil {
		b.Fatal(err)
	}
	t1 := time.Now()
	meta, err := rt.Checkpoint(ctx, id, img, DumpOptions{})
	t2 := time.Now()
	if rerr := rt.Resume(ctx, id); rerr != nil {
		b.Fatal(rerr)
	}
	t3 := time.Now()
	if err != nil {
		b.Fatal(err)
	}
	if meta.CRIU == nil {
		b.Fatal("the dump left no CRIU statistics")
	}
	ph.pause, ph.freeze, ph.checkpoint, ph.thaw = t3.Sub(t0), t1.Sub(t0), t2.Sub(t1), t3.Sub(t2)
	ph.frozen, ph.memdump, ph.memwrite = meta.CRIU.FreezingTime+meta.CRIU.FrozenTime, meta.CRIU.MemdumpTime, meta.CRIU.MemwriteTime
	return meta, ph
}

// cutPhases splits a pause: runc pause, runc checkpoint (of which CRIU's
// own frozen window, and within it the memory drain and write; the rest is
// runc's and CRIU's start-up and exit), runc resume.
type cutPhases struct {
	pause, freeze, checkpoint, frozen, memdump, memwrite, thaw time.Duration
}

type phaseSeries []cutPhases

func (s phaseSeries) med(f func(cutPhases) time.Duration) float64 {
	var ds []time.Duration
	for _, p := range s {
		ds = append(ds, f(p))
	}
	return msOf(median(ds))
}

// report writes the medians of a series as metrics named PREFIX-PHASE-ms.
func (s phaseSeries) report(b *testing.B, prefix string) {
	b.ReportMetric(s.med(func(p cutPhases) time.Duration { return p.pause }), prefix+"pause-ms")
	b.ReportMetric(s.med(func(p cutPhases) time.Duration { return p.freeze }), prefix+"runc-pause-ms")
	b.ReportMetric(s.med(func(p cutPhases) time.Duration { return p.checkpoint - p.frozen }), prefix+"runc+criu-start-exit-ms")
	b.ReportMetric(s.med(func(p cutPhases) time.Duration { return p.frozen }), prefix+"criu-frozen-ms")
	// Reported apart: CRIU's memory-write timer runs inside its dump timer.
	b.ReportMetric(s.med(func(p cutPhases) time.Duration { return p.memdump }), prefix+"criu-memdump-ms")
	b.ReportMetric(s.med(func(p cutPhases) time.Duration { return p.memwrite }), prefix+"criu-memwrite-ms")
	b.ReportMetric(s.med(func(p cutPhases) time.Duration { return p.thaw }), prefix+"runc-resume-ms")
}

// directDump runs `criu dump` itself on the container's init: the same
// CRIU binary, environment (CRIU_FAULT, CRIU_CONFIG_FILE) and options as
// runc gives it (the flags turnsnap always passes, --leave-running, the
// container's network namespace external, the freezer cgroup to freeze
// through), into a tmpfs directory. It returns its wall time and CRIU's own
// statistics and the image's bytes.
func directDump(b *testing.B, ctx context.Context, rt *Runtime, id, dir string) (time.Duration, criu.DumpStats, int64) {
	st, err := rt.State(ctx, id)
	if err != nil {
		b.Fatal(err)
	}
	var ns unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", st.InitPID), &ns); err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	args := append([]string{"dump", "-t", strconv.Itoa(st.InitPID), "-D", dir, "-o", "dump.log", "-v4", "--leave-running",
		"--external", fmt.Sprintf("net[%d]:extRootNetNS", ns.Ino),
		"--freeze-cgroup", filepath.Join("/sys/fs/cgroup/freezer", rt.cgroupsPath(id))}, alwaysCRIUFlags...)
	cmd := exec.CommandContext(ctx, rt.cfg.CRIU, args...)
	cmd.Env = rt.criuEnv()
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err != nil {
		b.Fatalf("criu dump: %v: %s %s", err, out, criu.LogErrors(filepath.Join(dir, "dump.log")))
	}
	ds, err := criu.ReadDumpStats(filepath.Join(dir, criu.StatsDumpFile))
	if err != nil {
		b.Fatal(err)
	}
	n, _, err := dirSize(dir)
	if err != nil {
		b.Fatal(err)
	}
	return took, ds, n
}

// BenchmarkScaleBigProcess: a container holding a process of 1 GiB of
// pseudo-random memory (64 MiB under TURNSNAP_BENCH_SMALL), half of it
// rewritten before every dump as between two turns, and a busybox httpd.
// Per iteration:
//
//   - turnsnap's cut (runc pause, Checkpoint into a directory on disk as
//     the engine's work directory is, runc resume): pause-ms (freeze to
//     thaw), criu-frozen-ms (CRIU's own freezing_time + frozen_time from
//     its stats-dump), image-MiB;
//   - the baseline, `criu dump` run directly on the same container in the
//     same run (directDump: same binary, environment and options, images
//     to a tmpfs): direct-wall-ms, direct-frozen-ms, and the ratios
//     x-direct-frozen (turnsnap's pause over CRIU's own frozen time in the
//     direct run) and x-direct-wall;
//   - the same cut with the image written to a tmpfs (/dev/shm) instead of
//     disk: the metrics prefixed tmpfs-;
//   - restore-ms: Restore of turnsnap's image into a new container, ready
//     when its httpd answers.
//
// The order of the three dumps rotates by iteration.
func BenchmarkScaleBigProcess(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	loadStart := benchenv.Load1(b) // reported at the end: ResetTimer drops earlier metrics
	rt := newRuntime(b)
	mib := benchenv.Size(1024, 64)
	p := startBigProc(b, ctx, rt, mib)
	tmpfs := filepath.Join("/dev/shm", fmt.Sprintf("turnsnap-bench-%d", os.Getpid()))
	b.Cleanup(func() { os.RemoveAll(tmpfs) })
	var ts, tsTmpfs phaseSeries
	var dWall, dFrozen, restores []time.Duration
	var image, dImage int64
	b.ResetTimer()
	for i := range b.N {
		img := filepath.Join(b.TempDir(), "img")
		turnsnap := func() {
			p.dirty(b)
			meta, ph := cut(b, ctx, rt, p.id, img)
			ts, image = append(ts, ph), meta.Bytes
		}
		direct := func() {
			p.dirty(b)
			wall, ds, n := directDump(b, ctx, rt, p.id, filepath.Join(tmpfs, strconv.Itoa(i)))
			dWall, dFrozen, dImage = append(dWall, wall), append(dFrozen, ds.FreezingTime+ds.FrozenTime), n
			os.RemoveAll(filepath.Join(tmpfs, strconv.Itoa(i)))
		}
		turnsnapTmpfs := func() {
			p.dirty(b)
			dir := filepath.Join(tmpfs, "ts"+strconv.Itoa(i))
			_, ph := cut(b, ctx, rt, p.id, dir)
			tsTmpfs = append(tsTmpfs, ph)
			os.RemoveAll(dir)
		}
		runs := []func(){turnsnap, direct, turnsnapTmpfs}
		for k := range runs {
			runs[(i+k)%len(runs)]()
		}
		rid := newID(b, rt)
		start := time.Now()
		if _, err := rt.Restore(ctx, rid, p.rootfs, img, RestoreOptions{}); err != nil {
			b.Fatal(err)
		}
		waitFor(b, time.Minute, "the restored httpd to answer", func() bool {
			var out strings.Builder
			code, err := rt.Exec(ctx, rid, []string{"wget", "-q", "-O", "-", "http://127.0.0.1:8080/"}, nil, &out, nil)
			return err == nil && code == 0 && out.String() == "dev server\n"
		})
		restores = append(restores, time.Since(start))
		if err := rt.Delete(ctx, rid); err != nil {
			b.Fatal(err)
		}
		os.RemoveAll(img)
	}
	b.StopTimer()
	ts.report(b, "")
	tsTmpfs.report(b, "tmpfs-")
	b.ReportMetric(float64(mib), "rss-MiB")
	b.ReportMetric(float64(image)/(1<<20), "image-MiB")
	b.ReportMetric(float64(dImage)/(1<<20), "direct-image-MiB")
	b.ReportMetric(msOf(median(dWall)), "direct-wall-ms")
	b.ReportMetric(msOf(median(dFrozen)), "direct-frozen-ms")
	pause := ts.med(func(p cutPhases) time.Duration { return p.pause })
	b.ReportMetric(pause/msOf(median(dFrozen)), "x-direct-frozen")
	b.ReportMetric(pause/msOf(median(dWall)), "x-direct-wall")
	b.ReportMetric(msOf(median(restores)), "restore-ms")
	b.ReportMetric(loadStart, "load-start")
	b.ReportMetric(benchenv.Load1(b), "load-end")
}

// BenchmarkScalePauseSmallTree: the pause of a small process tree (the
// keeper, a busybox httpd, a shell loop), turnsnap's cut phase by phase
// (cutPhases), in rounds alternating between CRIU finding its kernel-data
// cache (proc/kdat.go) and not (the link removed before the round, as on a
// host where turnsnap did not keep it): the metrics with the prefix
// "nokdat-" are the baseline, x-kdat the ratio of the median pauses. 30
// rounds of each (5 under TURNSNAP_BENCH_SMALL).
func BenchmarkScalePauseSmallTree(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	loadStart := benchenv.Load1(b) // reported at the end: ResetTimer drops earlier metrics
	rt := newRuntime(b)
	rootfs := busyboxRootfs(b)
	if err := os.WriteFile(filepath.Join(rootfs, "www", "index.html"), []byte("dev server\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	id := startKeeper(b, rt, rootfs)
	for _, argv := range [][]string{{"httpd", "-f", "-p", "8080", "-h", "/www"}, {"sh", "-c", "while :; do sleep 3600; done"}} {
		if _, err := rt.ExecDetached(ctx, id, argv, DetachOptions{Log: "/tmp/out.log"}); err != nil {
			b.Fatal(err)
		}
	}
	rounds := benchenv.Size(30, 5)
	var with, without phaseSeries
	b.ResetTimer()
	for range b.N {
		for i := range 2 * rounds {
			b.StopTimer()
			img := filepath.Join(b.TempDir(), "img")
			kdat := i%2 == 0
			if kdat {
				if _, err := criu.EnsureKdat(ctx, rt.cfg.CRIU, rt.criuEnv()); err != nil {
					b.Fatal(err)
				}
			} else if link, _ := os.Readlink(criu.KdatPath); link == criu.KdatFile {
				os.Remove(criu.KdatPath)
			}
			b.StartTimer()
			_, ph := cut(b, ctx, rt, id, img)
			b.StopTimer()
			if kdat {
				with = append(with, ph)
			} else {
				without = append(without, ph)
			}
			os.RemoveAll(img)
			b.StartTimer()
		}
	}
	b.StopTimer()
	if _, err := criu.EnsureKdat(ctx, rt.cfg.CRIU, rt.criuEnv()); err != nil {
		b.Fatal(err)
	}
	with.report(b, "")
	without.report(b, "nokdat-")
	b.ReportMetric(with.med(func(p cutPhases) time.Duration { return p.pause })/
		without.med(func(p cutPhases) time.Duration { return p.pause }), "x-kdat")
	b.ReportMetric(loadStart, "load-start")
	b.ReportMetric(benchenv.Load1(b), "load-end")
}
