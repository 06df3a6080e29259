package engine

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/benchenv"
	"github.com/turnsnap/turnsnap/internal/btrfstest"
)

// btrfsBenchShape is the base size the btrfs issue asks for (at least
// 50,000 files) and the sizes the sandboxes' writable layer grows through
// before each round of timed turns (earlier turns' edits: half modified
// base files, half new ones; a dependency install easily adds 10,000).
// TURNSNAP_BENCH_SMALL shrinks them for `make test`.
func btrfsBenchShape() (baseFiles int, layers []int) {
	if benchenv.Small() {
		return 500, []int{50, 200}
	}
	return 50000, []int{2000, 10000}
}

// BenchmarkBtrfsVsOverlay runs the same turns on an overlay sandbox and a
// btrfs sandbox of the same base in one run, so the ratios compare like
// with like, at each layer size:
//
//   - noop: a turn that changed nothing (class skip). Overlay walks its
//     upper directory; btrfs compares generations (a commit of pending
//     inode updates, then one tree-search ioctl).
//   - fs-10-files: a turn that rewrote 10 base files spread over the tree.
//     Overlay walks the whole upper directory and reads the 10 files; btrfs
//     snapshots, asks which inodes changed, and looks only at those paths.
//   - rollback: back to the checkpoint that made the layer and forth to the
//     newest, alternating, so every iteration changes the root. Overlay
//     rewrites its upper directory from the store; btrfs snapshots a
//     restore point.
//
// entries/op is what the scan looked at (overlay: every upper entry;
// btrfs: the changed paths and the directories above them), the O(change)
// evidence; files-read/op counts content reads.
func BenchmarkBtrfsVsOverlay(b *testing.B) {
	ctx := context.Background()
	nBase, layers := btrfsBenchShape()
	base := benchBase(b, nBase)
	pool := btrfstest.Pool(b)
	e := newEngine(b)
	sandboxes := []struct {
		name string
		opts CreateOptions
	}{
		{"overlay", CreateOptions{Base: base}},
		{"btrfs", btrfsOpts(pool, base)},
	}
	roots := map[string]string{}
	for _, s := range sandboxes {
		cr, err := e.CreateSandbox(ctx, delta.SandboxName(s.name), s.opts)
		must(b, err)
		roots[s.name] = cr.Root
	}
	rng := rand.New(rand.NewSource(3))
	grown, edits := 0, 0
	for _, layer := range layers {
		targets := map[string]string{}
		for _, s := range sandboxes {
			for i := grown; i < layer; i++ {
				var p string
				if i%2 == 0 {
					p = benchPath(roots[s.name], (i*7919)%nBase)
				} else {
					p = filepath.Join(roots[s.name], fmt.Sprintf("new%02d/n%05d.txt", i/200, i))
				}
				must(b, os.MkdirAll(filepath.Dir(p), 0o755))
				must(b, os.WriteFile(p, fileBody(rng, 512+rng.Intn(3584)), 0o644))
			}
			settle()
			cp, err := e.Checkpoint(ctx, delta.SandboxName(s.name), CheckpointOptions{})
			must(b, err)
			targets[s.name] = cp.ID.String()
		}
		grown = layer
		b.Run(fmt.Sprintf("layer=%d", layer), func(b *testing.B) {
			b.Run("noop", func(b *testing.B) {
				for _, s := range sandboxes {
					b.Run(s.name, func(b *testing.B) {
						var entries, read int64
						for b.Loop() {
							r, err := e.Checkpoint(ctx, delta.SandboxName(s.name), CheckpointOptions{})
							must(b, err)
							if r.Class != delta.ClassSkip {
								b.Fatalf("no-op turn classed %s", r.Class)
							}
							entries += r.Stats.Entries
							read += r.Stats.FilesRead
						}
						b.ReportMetric(float64(entries)/float64(b.N), "entries/op")
						b.ReportMetric(float64(read)/float64(b.N), "files-read/op")
					})
				}
			})
			b.Run("fs-10-files", func(b *testing.B) {
				for _, s := range sandboxes {
					b.Run(s.name, func(b *testing.B) {
						var entries, read int64
						for b.Loop() {
							b.StopTimer()
							for range 10 {
								edits++
								p := benchPath(roots[s.name], (edits*104729)%nBase)
								must(b, os.WriteFile(p, fileBody(rng, 2048), 0o644))
							}
							b.StartTimer()
							r, err := e.Checkpoint(ctx, delta.SandboxName(s.name), CheckpointOptions{})
							must(b, err)
							if r.Class != delta.ClassFS {
								b.Fatalf("10-file turn classed %s", r.Class)
							}
							entries += r.Stats.Entries
							read += r.Stats.FilesRead
						}
						b.ReportMetric(float64(entries)/float64(b.N), "entries/op")
						b.ReportMetric(float64(read)/float64(b.N), "files-read/op")
					})
				}
			})
			b.Run("rollback", func(b *testing.B) {
				for _, s := range sandboxes {
					b.Run(s.name, func(b *testing.B) {
						log, err := e.History().Log(ctx, delta.SandboxName(s.name))
						must(b, err)
						alt := [2]string{targets[s.name], log[0].ID.String()}
						n := 0
						for b.Loop() {
							if _, err := e.Rollback(ctx, delta.SandboxName(s.name), mustRef(alt[n%2]), RollbackOptions{}); err != nil {
								b.Fatal(err)
							}
							n++
						}
						// Leave the sandbox at its newest state for the next round.
						if n%2 == 1 {
							_, err := e.Rollback(ctx, delta.SandboxName(s.name), mustRef(alt[1]), RollbackOptions{})
							must(b, err)
						}
					})
				}
			})
		})
	}
}

// benchBase writes n files of source-like content, 200 to a directory.
func benchBase(b *testing.B, n int) string {
	b.Helper()
	rng := rand.New(rand.NewSource(1))
	dir := b.TempDir()
	for i := range n {
		p := benchPath(dir, i)
		if i%200 == 0 {
			must(b, os.MkdirAll(filepath.Dir(p), 0o755))
		}
		must(b, os.WriteFile(p, fileBody(rng, 512+rng.Intn(3584)), 0o644))
	}
	return dir
}

func benchPath(root string, i int) string {
	return filepath.Join(root, fmt.Sprintf("pkg%03d/sub%d/f%05d.go", i/800, (i/200)%4, i))
}
