package fstree

import (
	"io"
	"os"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// Source is a loader for Materialise that also names the directory the tree
// was just scanned from: a base being imported (engine's CreateSandbox).
// Materialise copies a regular file without holes from there, in the
// kernel where it can (copy_file_range), when that file is still a regular
// file of the entry's size, instead of loading, decompressing and hashing
// its chunks from the store a second time; everything else (trees, files
// that differ or have holes) comes from the Loader.
//
// A file copied this way is NOT checked against the tree's hashes as it is
// written, and Dir may have changed since the scan: the caller must verify
// the result as a whole (the backends' PrepareBase scans the copy and
// compares its tree before publishing it) and, when it does not verify,
// materialise again from the store alone.
type Source struct {
	delta.BlobLoader
	Dir string
}

// copyFromSource writes e's content into f from src's copy of rel. ok is
// false, with f left empty, when that copy cannot stand for e (absent, not
// a regular file, another size, sparse in the tree, or shorter than its
// size by the time it is read): the caller loads the chunks instead.
// srcFD is the source directory, opened once per apply; rel is opened
// beneath it without following any symlink, as every scan opens files.
func copyFromSource(srcFD int, rel string, f *os.File, e *delta.Entry) (n uint64, ok bool, err error) {
	if len(e.Holes) > 0 {
		return 0, false, nil
	}
	fd, err := fsat.Open(srcFD, rel, unix.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK)
	if err != nil {
		return 0, false, nil
	}
	in := os.NewFile(uintptr(fd), rel)
	defer in.Close()
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || uint64(st.Size) != e.Size {
		return 0, false, nil
	}
	// ReadFrom uses copy_file_range (same filesystem), then splice, then
	// a read/write loop: the bytes never need to pass through Go's heap.
	w, err := f.ReadFrom(io.LimitReader(in, int64(e.Size)))
	if err == nil && uint64(w) == e.Size {
		return e.Size, true, nil
	}
	// The source shrank or failed under us: start the file again.
	if terr := f.Truncate(0); terr != nil {
		return 0, false, terr
	}
	if _, serr := f.Seek(0, io.SeekStart); serr != nil {
		return 0, false, serr
	}
	return 0, false, nil
}
