package fstree

import (
	"context"
	"github.com/turnsnap/turnsnap/delta"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// zerosWithRuns reads as a file of size bytes, zero except for runs.
type zerosWithRuns struct {
	at, size int64
	runs     map[int64][]byte
}

func (z *zerosWithRuns) Read(p []byte) (int, error) {
	if z.at >= z.size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), z.size-z.at))
	clear(p[:n])
	for off, d := range z.runs {
		if off < z.at+int64(n) && off+int64(len(d)) > z.at {
			lo, hi := max(off, z.at), min(off+int64(len(d)), z.at+int64(n))
			copy(p[lo-z.at:hi-z.at], d[lo-off:hi-off])
		}
	}
	z.at += int64(n)
	return n, nil
}

// BenchmarkSparseRollback restores a 1 GiB file holding 8 KiB (two 4 KiB
// runs) the way an overlay rollback does (Materialise into a fresh upper,
// then the verifying re-scan), from two trees of the same file state:
// "dense" is how the code before sparse files recorded it (every byte
// chunked, the zeros included), the baseline in the same run; "sparse" is
// the tree with holes. Reported: milliseconds per rollback and the disk
// the restored file uses. TURNSNAP_BENCH_SMALL=1 uses a 64 MiB file.
func BenchmarkSparseRollback(b *testing.B) {
	ctx := context.Background()
	size := int64(1 << 30)
	if os.Getenv("TURNSNAP_BENCH_SMALL") == "1" {
		size = 64 << 20
	}
	runs := map[int64][]byte{size / 10: make([]byte, 4096), size * 9 / 10: make([]byte, 4096)}
	for i := range 4096 {
		runs[size/10][i], runs[size*9/10][i] = byte(i%251+1), 0xb7
	}
	mem := newMem()
	// The sparse tree: scan a real sparse file.
	src := b.TempDir()
	f, err := os.Create(filepath.Join(src, "disk.img"))
	if err != nil {
		b.Fatal(err)
	}
	f.Truncate(size)
	for off, d := range runs {
		f.WriteAt(d, off)
	}
	f.Close()
	res, err := Scan(ctx, src, ScanOptions{Saver: mem})
	if err != nil {
		b.Fatal(err)
	}
	sparseTree, err := delta.LoadTree(ctx, mem, res.Root)
	if err != nil {
		b.Fatal(err)
	}
	// The dense tree: the same entry, its content chunked in full.
	dense := sparseTree.Entries[0]
	dense.Holes, dense.Chunks = nil, nil
	if err := delta.ChunkReader(&zerosWithRuns{size: size, runs: runs}, func(c []byte) error {
		id := delta.Hash(c)
		mem.SaveBlob(ctx, delta.BlobData, id, c)
		dense.Chunks = append(dense.Chunks, id)
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	// Saved as every writer saves a tree: its chunk list first (a dense
	// file of this size names one), so it is the tree a scan makes.
	dense.ChunkList, dense.NChunks = delta.ID{}, 0
	denseID, _, err := delta.SaveTree(ctx, delta.IDs{}, &delta.Tree{Entries: []delta.Entry{dense}}, func(ctx context.Context, id delta.ID, data []byte) error {
		mem.SaveBlob(ctx, delta.BlobTree, id, data)
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		tree delta.ID
	}{{"dense", denseID}, {"sparse", res.Root}} {
		b.Run(tc.name, func(b *testing.B) {
			var spent time.Duration
			var disk int64
			for range b.N {
				b.StopTimer()
				dst := b.TempDir()
				b.StartTimer()
				start := time.Now()
				if _, err := Materialise(ctx, tc.tree, dst, ApplyOptions{Loader: mem}); err != nil {
					b.Fatal(err)
				}
				got, err := Scan(ctx, dst, ScanOptions{Quiescent: true})
				if err != nil {
					b.Fatal(err)
				}
				spent += time.Since(start)
				if got.Root != tc.tree {
					b.Fatalf("restored %s, want %s", got.Root.Short(), tc.tree.Short())
				}
				b.StopTimer()
				disk = diskUse(b, filepath.Join(dst, "disk.img"))
				os.RemoveAll(dst)
				b.StartTimer()
			}
			b.ReportMetric(spent.Seconds()*1000/float64(b.N), "ms/rollback")
			b.ReportMetric(float64(disk), "disk-bytes")
		})
	}
}

func diskUse(b *testing.B, p string) int64 {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		b.Fatal(err)
	}
	return st.Blocks * 512
}
