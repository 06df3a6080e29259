package lazy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/benchenv"
	"github.com/turnsnap/turnsnap/internal/loopfs"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"golang.org/x/sys/unix"
)

// BenchmarkScaleLazyRestore: the first command in a restored sandbox whose
// layer is only in the bucket (a real MinIO on 127.0.0.1, one object per
// chunk and tree), lazily (placeholders, fills on first open) against a
// full materialisation of the same layer, measured in the same iteration:
// from the start of the restore to the end of a first command (a shell
// reading a configuration file and listing a directory, through the overlay
// mount). Full size 1.4 GiB (20,000 files of 16 KiB in 200 directories and
// 17 files of 64 MiB); small 420 files, 22 MiB. It also reports the time a
// fetch-ahead takes to make the lazy layer whole after that command, and
// the lazy first command with the placeholders made by the walk alone (one
// writer), against which the parallel writers are measured.
func BenchmarkScaleLazyRestore(b *testing.B) {
	small, dirs, big, bigSize := benchenv.Size(20000, 400), benchenv.Size(200, 8), benchenv.Size(17, 2), benchenv.Size(64<<20, 8<<20)
	_, bucket := startBucket(b)
	src := b.TempDir()
	rng := rand.NewChaCha8([32]byte{7})
	for i := range small {
		p := filepath.Join(src, "src", fmt.Sprintf("pkg%03d", i%dirs), fmt.Sprintf("mod%05d.py", i))
		must(b, os.MkdirAll(filepath.Dir(p), 0o755))
		data := make([]byte, 16<<10)
		_, _ = rng.Read(data)
		must(b, os.WriteFile(p, data, 0o644))
	}
	must(b, os.MkdirAll(filepath.Join(src, "data"), 0o755))
	for i := range big {
		data := make([]byte, bigSize)
		_, _ = rng.Read(data)
		must(b, os.WriteFile(filepath.Join(src, "data", fmt.Sprintf("blob%02d.bin", i)), data, 0o644))
	}
	must(b, os.MkdirAll(filepath.Join(src, "app"), 0o755))
	must(b, os.WriteFile(filepath.Join(src, "app/config.json"), []byte(`{"port": 8080}`+"\n"), 0o644))
	tree := stored(b, bucket, src)
	must(b, os.RemoveAll(src))
	// Both restores write to an ext4 of their own, and nothing on it is
	// deleted until both are measured: ext4 skips inodes freed in the
	// last minutes when it allocates (recently_deleted walks their table
	// blocks), which made a create cost 0.5 ms instead of 30 us on the
	// host's filesystem right after a 20,000-file removal (this
	// benchmark's own, or the benchmark before it in make bench-scale).
	// The inode tables are written by mkfs, not by a background thread
	// during the run.
	fs := loopfs.Mount(b, "ext4", 8<<30, "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0")
	// The checkpoint's metadata is local (as after a catalog rebuild and
	// the trees' packs): both restores read trees from memory, chunks from
	// the bucket.
	bucket.trees = map[delta.ID][]byte{}
	_, err := fileEntries(context.Background(), bucket, tree)
	must(b, err)
	total := int64(small)*16<<10 + int64(big)*int64(bigSize)
	first := func(mnt string) {
		out, err := exec.Command("sh", "-c", "cat "+mnt+"/app/config.json && ls "+mnt+"/src/pkg000 | wc -l").CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), `{"port": 8080}`) {
			b.Fatalf("first command: %q %v", out, err)
		}
	}
	load0 := benchenv.Load1(b)
	var lazyT, oneT, fullT, completeT time.Duration
	for b.Loop() {
		// Full materialisation, then the command.
		l := newLayoutIn(b, fs)
		t0 := time.Now()
		_, err := fstree.Materialise(context.Background(), tree, l.upper, fstree.ApplyOptions{Loader: bucket})
		must(b, err)
		l.mount(b)
		first(l.mnt)
		fullT += time.Since(t0)
		must(b, unix.Unmount(l.mnt, 0))
		fullDir := l.dir

		// Lazy with the walk alone making the placeholders (one writer):
		// what the parallel writers are measured against.
		l = newLayoutIn(b, fs)
		t0 = time.Now()
		f, err := Restore(context.Background(), Config{Sandbox: "bench", Dir: l.dir, Upper: l.upper, Tree: tree, Loader: bucket, Writers: 1})
		must(b, err)
		l.mount(b)
		first(l.mnt)
		oneT += time.Since(t0)
		must(b, f.Close())
		must(b, unix.Unmount(l.mnt, 0))
		oneDir := l.dir

		// Lazy: placeholders, then the command; then the rest.
		l = newLayoutIn(b, fs)
		t0 = time.Now()
		f, err = Restore(context.Background(), Config{Sandbox: "bench", Dir: l.dir, Upper: l.upper, Tree: tree, Loader: bucket})
		must(b, err)
		l.mount(b)
		first(l.mnt)
		lazyT += time.Since(t0)
		t1 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		must(b, f.FetchAhead(ctx, nil))
		cancel()
		completeT += time.Since(t1)
		must(b, f.Close())
		must(b, unix.Unmount(l.mnt, 0))
		must(b, os.RemoveAll(l.dir))
		must(b, os.RemoveAll(fullDir))
		must(b, os.RemoveAll(oneDir))
	}
	n := float64(b.N)
	b.ReportMetric(lazyT.Seconds()/n, "lazy_first_cmd_s")
	b.ReportMetric(fullT.Seconds()/n, "full_first_cmd_s")
	b.ReportMetric(fullT.Seconds()/lazyT.Seconds(), "full/lazy")
	b.ReportMetric(oneT.Seconds()/n, "lazy_one_writer_first_cmd_s")
	b.ReportMetric(oneT.Seconds()/lazyT.Seconds(), "one_writer/lazy")
	b.ReportMetric(completeT.Seconds()/n, "lazy_complete_s")
	b.ReportMetric(float64(total)/(1<<20), "layer_MiB")
	b.ReportMetric(load0, "load1_start")
	b.ReportMetric(benchenv.Load1(b), "load1_end")
}
