package lazy

import (
	"context"
	"fmt"

	"github.com/turnsnap/turnsnap/delta"
	"golang.org/x/sys/unix"
)

// writeData writes entry e's chunks into the placeholder fd, which already
// has e's size and holds only holes: each data run is written at its
// offset, and nothing is truncated or punched. (An ftruncate, even through
// the group's own descriptor, raises a pre-access event on this kernel:
// the fill would wait for itself. fstree.WriteContent truncates.) Chunks
// are verified by the loader. Data past limit (the file's size now: a
// truncate(2) by path through overlay raises no event, so the file may
// have been cut before its first open) is not written, so a cut file keeps
// the stored head, as it would have. It returns the data bytes loaded.
func writeData(ctx context.Context, loader delta.BlobLoader, fd int, e *delta.Entry, limit uint64) (uint64, error) {
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
		// A chunk may span data runs: the chunks' stream is laid into the
		// runs in order.
		for len(data) > 0 && len(runs) > 0 {
			k := min(uint64(len(data)), runs[0].Len)
			if off := runs[0].Off; off < limit {
				if err := pwriteAll(fd, data[:min(k, limit-off)], int64(off)); err != nil {
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

func pwriteAll(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		if err != nil {
			return err
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}
