package catalog

import (
	"os"
	"path/filepath"
	"testing"
)

// Opening a catalog after a SIGKILL replays the old memtables and Badger
// deletes each once flushed (truncate to 0, then remove), while
// preallocateMemtables walks the same files: a file it finds empty or gone
// is not an error. Found by `turnsnap bench`, whose daemon restart after a
// SIGKILL failed with "allocate 00004.mem: invalid argument".
func TestPreallocateSkipsEmptyAndGoneMemtables(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "00004.mem"), nil, 0o644)                // truncated by the flush
	os.Symlink("missing", filepath.Join(dir, "00005.mem"))                   // removed after the glob
	os.WriteFile(filepath.Join(dir, "00006.mem"), make([]byte, 4096), 0o644) // a live one
	if err := preallocateMemtables(dir); err != nil {
		t.Fatal(err)
	}
}
