package fstree

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/turnsnap/turnsnap/delta"
	"golang.org/x/sys/unix"
)

// WriteContent is the one file-content writer of every restore: it writes
// file entry e's chunks into f, each verified by the loader, and checks
// they add up to the entry's data size. A sparse entry's file is first
// given its size (ftruncate) and then only its data runs are written, so
// holes stay holes. inPlace says f may hold old content (a rewrite rather
// than a fresh O_EXCL file): then it is cut to e.Size and every hole of e
// is punched (FALLOC_FL_PUNCH_HOLE; zeros written where the filesystem
// cannot punch), so no old byte survives. It returns the data bytes written.
func WriteContent(ctx context.Context, loader delta.BlobLoader, f *os.File, e *delta.Entry, inPlace bool) (uint64, error) {
	if len(e.Holes) == 0 && !inPlace {
		return WriteRuns(ctx, loader, f, e, e.Size) // one run, front to back
	}
	if err := f.Truncate(int64(e.Size)); err != nil {
		return 0, fmt.Errorf("set size: %w", err)
	}
	if inPlace {
		for _, h := range e.Holes {
			if err := punch(f, h); err != nil {
				return 0, err
			}
		}
	}
	return WriteRuns(ctx, loader, f, e, e.Size)
}

// WriteRuns lays file entry e's chunks, each verified by the loader, into
// e's data runs in w at their offsets, writing nothing at or past limit,
// and checks they add up to the entry's data size. It neither sizes w nor
// punches: WriteContent does that first, and lazy restore (overlay/lazy)
// fills a placeholder that already has its size and may have been cut
// (limit) before its first open. It returns the data bytes loaded.
func WriteRuns(ctx context.Context, loader delta.BlobLoader, w io.WriterAt, e *delta.Entry, limit uint64) (uint64, error) {
	chunks, err := delta.LoadChunks(ctx, loader, e)
	if err != nil {
		return 0, err
	}
	runs := delta.DataRuns(e.Size, e.Holes)
	var n uint64
	for _, c := range chunks {
		if n > e.DataSize() {
			break // already more than declared: CheckFileSize says so
		}
		data, err := loader.LoadBlob(ctx, delta.BlobData, c)
		if err != nil {
			return n, fmt.Errorf("chunk %s: %w", c.Short(), err)
		}
		n += uint64(len(data))
		// A chunk may span data runs: the stream of chunks is laid into
		// the runs in order.
		for len(data) > 0 && len(runs) > 0 {
			k := min(uint64(len(data)), runs[0].Len)
			if off := runs[0].Off; off < limit {
				if _, err := w.WriteAt(data[:min(k, limit-off)], int64(off)); err != nil {
					return n, err
				}
			}
			data = data[k:]
			runs[0].Off += k
			if runs[0].Len -= k; runs[0].Len == 0 {
				runs = runs[1:]
			}
		}
	}
	return n, delta.CheckFileSize(e, n)
}

// punch deallocates hole h of f, or writes zeros over it where the
// filesystem cannot punch.
func punch(f *os.File, h delta.Hole) error {
	err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(h.Off), int64(h.Len))
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("punch hole %d+%d: %w", h.Off, h.Len, err)
	}
	zeros := make([]byte, min(h.Len, 1<<20))
	for off := h.Off; off < h.Off+h.Len; {
		k := min(uint64(len(zeros)), h.Off+h.Len-off)
		if _, err := f.WriteAt(zeros[:k], int64(off)); err != nil {
			return err
		}
		off += k
	}
	return nil
}
