// Package btrfstest gives tests a real btrfs filesystem (internal/loopfs):
// a sparse image file formatted with mkfs.btrfs and loop-mounted in the
// test's temp dir, torn down in t.Cleanup even when the test fails.
package btrfstest

import (
	"os"
	"testing"

	"github.com/turnsnap/turnsnap/internal/loopfs"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// ImageSize is the sparse image's size: big enough for the 50,000-file
// benchmark base plus its snapshots, and free until written.
const ImageSize = 4 << 30

// Pool returns the mount point of a fresh btrfs filesystem for t. It needs
// root, mkfs.btrfs (btrfs-progs) and losetup; a missing part skips t, or
// fails it under `make test`.
func Pool(t testing.TB) string {
	t.Helper()
	if _, err := os.Stat("/dev/btrfs-control"); err != nil {
		testenv.RequireRoot(t)
		testenv.Missing(t, "/dev/btrfs-control", "btrfs tests loop-mount an image")
	}
	return loopfs.Mount(t, "btrfs", ImageSize, "-q")
}
