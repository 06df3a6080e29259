package proc

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
)

// benchMiB is the size of the benchmark's process: 200 MiB as the issue
// asks, 20 MiB under TURNSNAP_BENCH_SMALL (make test's one-shot run).
func benchMiB() int {
	if os.Getenv("TURNSNAP_BENCH_SMALL") != "" {
		return 20
	}
	return 200
}

// buildMemhog compiles testdata/memhog statically into rootfs/bin.
func buildMemhog(b *testing.B, rootfs string) {
	b.Helper()
	cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(rootfs, "bin", "memhog"), "./testdata/memhog")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build memhog: %v: %s", err, out)
	}
}

// BenchmarkCheckpoint measures, for a container holding one process of
// benchMiB of resident pseudo-random memory, each phase of a process
// checkpoint separately:
//
//   - freeze: runc pause (cgroup freezer) of the big container; baseline:
//     the same on an idle busybox container, as the x-idle ratio.
//   - dump: Checkpoint of the paused container, with b.SetBytes(RSS) and
//     the image size; baseline: copying the image's files (the floor for
//     writing that many bytes), as the x-copy ratio.
//   - redump: a second dump of the unchanged process, chunked with the
//     content store's chunker (delta.ChunkReader, delta.Hash) against the
//     first: new-B and new-% are the chunk bytes a content store would add,
//     new-stored-B the same compressed with its codec (delta.Codec); dump's
//     stored-B is the first image's chunks compressed.
//   - restore: Restore of the image into a new container.
//   - snapshot: Snapshot of the container (the change-detection read).
func BenchmarkCheckpoint(b *testing.B) {
	top := b // owns the images that outlive one sub-benchmark
	rt := newRuntime(b)
	ctx := testCtx(b)
	mib := benchMiB()
	rootfs := busyboxRootfs(b)
	buildMemhog(b, rootfs)
	id := startKeeper(b, rt, rootfs)
	if _, err := rt.ExecDetached(ctx, id, []string{"/bin/memhog", fmt.Sprint(mib), "/tmp/ready"}, DetachOptions{Log: "/tmp/memhog.log"}); err != nil {
		b.Fatal(err)
	}
	waitFor(b, 2*time.Minute, "memhog to fill its memory", func() bool {
		_, err := os.Stat(filepath.Join(rootfs, "tmp", "ready"))
		return err == nil
	})
	set, err := rt.Snapshot(ctx, id)
	if err != nil || len(set.Procs) != 1 {
		b.Fatalf("snapshot: %v %v", set.Procs, err)
	}
	rss := set.Procs[0].RSS
	b.Logf("memhog: %d MiB asked, RSS %.1f MiB", mib, float64(rss)/(1<<20))
	idle := startKeeper(b, rt, busyboxRootfs(b))

	pause := func(b *testing.B, id string) {
		if err := rt.Pause(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
	resume := func(b *testing.B, id string) {
		if err := rt.Resume(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("freeze", func(b *testing.B) {
		var idleTook time.Duration
		for range b.N {
			pause(b, id) // timed
			b.StopTimer()
			resume(b, id)
			start := time.Now()
			pause(b, idle)
			idleTook += time.Since(start)
			resume(b, idle)
			b.StartTimer()
		}
		b.ReportMetric(float64(b.Elapsed())/float64(idleTook), "x-idle")
	})

	// dump checkpoints the paused container; only Checkpoint is timed.
	dump := func(b *testing.B) (string, ImageMeta) {
		b.StopTimer()
		img := filepath.Join(top.TempDir(), "img")
		pause(b, id)
		b.StartTimer()
		meta, err := rt.Checkpoint(ctx, id, img, DumpOptions{})
		b.StopTimer()
		resume(b, id)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		return img, meta
	}
	var ref string
	b.Run("dump", func(b *testing.B) {
		b.SetBytes(rss)
		var copyTook time.Duration
		var meta ImageMeta
		for range b.N {
			ref, meta = dump(b)
			b.StopTimer()
			start := time.Now()
			copyDir(b, ref, filepath.Join(b.TempDir(), "copy"))
			copyTook += time.Since(start)
			b.StartTimer()
		}
		b.StopTimer()
		chunks, _ := chunkDir(b, ref)
		b.ReportMetric(float64(rss), "rss-B")
		b.ReportMetric(float64(meta.Bytes), "image-B")
		b.ReportMetric(float64(storedBytes(b, chunks)), "stored-B")
		b.ReportMetric(float64(b.Elapsed())/float64(copyTook), "x-copy")
	})

	b.Run("redump", func(b *testing.B) {
		b.SetBytes(rss)
		b.StopTimer()
		refChunks, refBytes := chunkDir(b, ref)
		b.StartTimer()
		var newB, total int64
		var fresh map[delta.ID][]byte
		for range b.N {
			img, _ := dump(b)
			b.StopTimer()
			chunks, n := chunkDir(b, img)
			total, newB = n, 0
			fresh = make(map[delta.ID][]byte)
			for h, data := range chunks {
				if _, ok := refChunks[h]; !ok {
					newB += int64(len(data))
					fresh[h] = data
				}
			}
			b.StartTimer()
		}
		b.StopTimer()
		b.ReportMetric(float64(refBytes), "first-B")
		b.ReportMetric(float64(total), "image-B")
		b.ReportMetric(float64(newB), "new-B")
		b.ReportMetric(float64(storedBytes(b, fresh)), "new-stored-B")
		b.ReportMetric(100*float64(newB)/float64(total), "new-%")
	})

	b.Run("restore", func(b *testing.B) {
		b.SetBytes(rss)
		for range b.N {
			b.StopTimer()
			rid := newID(b, rt)
			b.StartTimer()
			if _, err := rt.Restore(ctx, rid, rootfs, ref, RestoreOptions{}); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := rt.Delete(ctx, rid); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})

	b.Run("snapshot", func(b *testing.B) {
		for range b.N {
			if _, err := rt.Snapshot(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// chunkDir cuts every CRIU file of an image dir into the content store's
// chunks and returns each distinct chunk, and the total bytes.
func chunkDir(b *testing.B, dir string) (map[delta.ID][]byte, int64) {
	b.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	chunks := make(map[delta.ID][]byte)
	var total int64
	for _, e := range ents {
		if !e.Type().IsRegular() || e.Name() == MetaFile {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			b.Fatal(err)
		}
		err = delta.ChunkReader(f, func(data []byte) error {
			chunks[delta.Hash(data)] = append([]byte(nil), data...)
			total += int64(len(data))
			return nil
		})
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
	return chunks, total
}

// storedBytes is what a content store keeps for chunks: each compressed
// with the store's codec, or raw when that is not smaller.
func storedBytes(b *testing.B, chunks map[delta.ID][]byte) int64 {
	b.Helper()
	codec, err := delta.NewCodec()
	if err != nil {
		b.Fatal(err)
	}
	defer codec.Close()
	var n int64
	var buf []byte
	for _, data := range chunks {
		out, ok := codec.Compress(buf[:0], data)
		if ok {
			n += int64(len(out))
			buf = out
		} else {
			n += int64(len(data))
		}
	}
	return n
}

// copyDir copies the regular files of src into a new dir dst, synced like
// CRIU's own writes are not: only page cache, as CRIU leaves them.
func copyDir(b *testing.B, src, dst string) {
	b.Helper()
	if err := os.MkdirAll(dst, 0o700); err != nil {
		b.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range ents {
		in, err := os.Open(filepath.Join(src, e.Name()))
		if err != nil {
			b.Fatal(err)
		}
		out, err := os.Create(filepath.Join(dst, e.Name()))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(out, in); err != nil {
			b.Fatal(err)
		}
		in.Close()
		out.Close()
	}
}
