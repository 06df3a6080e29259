package fstree

import (
	"context"
	"errors"
	"fmt"
	"github.com/turnsnap/turnsnap/delta"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// FileReader reads regular files into chunks for every scan (overlay's
// upper, btrfs snapshots, bases): it finds holes with SEEK_DATA/SEEK_HOLE
// and never reads them, cuts the data with FastCDC, hashes each chunk and
// passes it to the saver. Past PipelineThreshold bytes it hands hashing and
// compression to a pipeline of workers (pipeline.go) whose saves stay in
// the order a single worker makes them. Not safe for concurrent use.
type FileReader struct {
	ids     delta.IDs
	saver   delta.BlobSaver
	stats   *ScanStats
	chunker *delta.Chunker
	workers int
	read    int64 // bytes read so far, against PipelineThreshold
	pipe    *pipeline
	pend    []*job // the chunks of the file being read, while pipelined
}

// PipelineThreshold is how many bytes a scan reads on its own goroutine
// before it starts the pipeline: a turn of a few small files starts no
// goroutines, and 1 MiB is about 2 ms of one core's chunking, hashing and
// compression, far more than starting the workers costs.
const PipelineThreshold = 1 << 20

// NewFileReader returns a reader that names chunks under ids, saves them to saver (nil: hash
// only, as a restore's verifying scan does; large ones hash on the
// pipeline's workers too) and counts into stats. workers bounds the pipeline's goroutines
// (0: GOMAXPROCS; 1: no pipeline at all).
func NewFileReader(ids delta.IDs, saver delta.BlobSaver, stats *ScanStats, workers int) *FileReader {
	return &FileReader{ids: ids, saver: saver, stats: stats, chunker: delta.NewChunker(), workers: delta.Workers(workers)}
}

// Save saves a blob in order with the chunks read before it: the tree of
// a directory after its files' chunks. data must not change afterwards.
// While pipelined an error may surface at a later Save, Read or Close.
func (r *FileReader) Save(ctx context.Context, t delta.BlobType, id delta.ID, data []byte) error {
	if r.saver == nil {
		return nil
	}
	if r.pipe != nil {
		return r.pipe.submit(ctx, &job{t: t, id: id, data: data, hashed: true})
	}
	_, err := r.saver.SaveBlob(ctx, t, id, data)
	return err
}

// Close waits for every pending save and stops the pipeline; it returns
// the first error of a save. A FileReader is not used after Close.
func (r *FileReader) Close() error {
	if r.pipe == nil {
		return nil
	}
	err := r.pipe.close()
	r.pipe = nil
	return err
}

// Read reads the regular file open as f, whose stat is st. Without holes
// it reads to end of file, so a file that grew shows as a size different
// from st's; with holes it reads the data runs of st.Size.
func (r *FileReader) Read(ctx context.Context, f *os.File, st *unix.Stat_t) (delta.FileContent, error) {
	r.stats.FilesRead++
	var c delta.FileContent
	var src io.Reader = f
	if mayBeSparse(st) {
		holes, err := findHoles(int(f.Fd()), st.Size)
		if err != nil {
			return c, err
		}
		if len(holes) > 0 {
			c.Holes = holes
			src = &runReader{f: f, runs: delta.DataRuns(uint64(st.Size), holes)}
		}
	}
	// Read-ahead: the kernel doubles its window for a sequential reader.
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_SEQUENTIAL)
	if r.pipe == nil && r.workers > 1 && r.read+st.Size > PipelineThreshold {
		r.pipe = startPipeline(ctx, r.ids, r.saver, r.workers)
	}
	var data uint64
	err := r.chunker.Chunk(src, st.Size, func(b []byte) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		data += uint64(len(b))
		r.stats.Chunks++
		if r.pipe != nil {
			j := &job{t: delta.BlobData, data: r.pipe.copyOf(b)}
			if err := r.pipe.submit(ctx, j); err != nil {
				return err
			}
			r.pend = append(r.pend, j)
			return nil
		}
		id := r.ids.Hash(b)
		if r.saver != nil {
			if _, err := r.saver.SaveBlob(ctx, delta.BlobData, id, b); err != nil {
				return err
			}
		}
		c.Chunks = append(c.Chunks, id)
		return nil
	})
	r.read += int64(data)
	r.stats.BytesRead += int64(data)
	if r.pipe != nil {
		ids, werr := r.pipe.ids(ctx, r.pend)
		r.pend = r.pend[:0]
		if err == nil {
			err = werr
		}
		c.Chunks = ids
	}
	if err != nil {
		return delta.FileContent{}, err
	}
	c.Size = data
	for _, h := range c.Holes {
		c.Size += h.Len
	}
	if len(c.Chunks) == 0 {
		c.Chunks = nil
	}
	return c, nil
}

// mayBeSparse says whether a file can have holes: fewer blocks allocated
// than its size needs. Most files do not, and for them the scan costs no
// extra system call. (A compressed btrfs file passes too and is probed for
// nothing.)
func mayBeSparse(st *unix.Stat_t) bool {
	return st.Size > 0 && st.Blocks*512 < st.Size
}

// findHoles lists the holes of the file open as fd within its first size
// bytes, at most MaxHoles (the rest is read as data). A filesystem without
// SEEK_DATA gives none.
func findHoles(fd int, size int64) ([]delta.Hole, error) {
	var holes []delta.Hole
	var at int64
	for at < size && len(holes) < delta.MaxHoles {
		data, err := unix.Seek(fd, at, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			data = size // no data after at: the rest is a hole
		} else if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
			return nil, nil
		} else if err != nil {
			return nil, fmt.Errorf("seek data: %w", err)
		}
		data = min(data, size)
		if data > at {
			holes = append(holes, delta.Hole{Off: uint64(at), Len: uint64(data - at)})
		}
		if data >= size {
			break
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("seek hole: %w", err)
		}
		at = hole
	}
	return holes, nil
}

// runReader reads the data runs of a sparse file in order, as one stream.
type runReader struct {
	f    *os.File
	runs []delta.Hole
}

func (r *runReader) Read(p []byte) (int, error) {
	for len(r.runs) > 0 && r.runs[0].Len == 0 {
		r.runs = r.runs[1:]
	}
	if len(r.runs) == 0 {
		return 0, io.EOF
	}
	run := &r.runs[0]
	n, err := r.f.ReadAt(p[:min(uint64(len(p)), run.Len)], int64(run.Off))
	run.Off += uint64(n)
	run.Len -= uint64(n)
	if err == io.EOF {
		if run.Len > 0 {
			// Shrunk while read: the scan's second stat sees it.
			r.runs = nil
		}
		err = nil
		if n == 0 {
			return 0, io.EOF
		}
	}
	return n, err
}
