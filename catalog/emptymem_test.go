package catalog

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
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

// Badger retires a flushed memtable (NNNNN.mem) or a spent value log
// (NNNNNN.vlog) by truncating it to zero and then unlinking it, and creates
// both empty before sizing them: a process killed in between leaves an empty
// file. Before the fix a read-only open then failed with "truncate ...:
// invalid argument" and the first writable one with "Create a new file"
// (issue 23). Each name is one such leftover: below, at and above the live
// files' numbers. TestKilledInsideBadger makes these states with real kills.
func TestOpenWithEmptyLogLeftByKill(t *testing.T) {
	for _, name := range []string{"00001.mem", "00009.mem", "000000.vlog", "000009.vlog"} {
		for _, readOnlyFirst := range []bool{true, false} {
			dir := t.TempDir()
			c := openAt(t, dir)
			putTestBlob(t, c, 1)
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			checkRecovered(t, dir, readOnlyFirst, []int{1})
			if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
				if fi, _ := os.Stat(filepath.Join(dir, name)); fi.Size() == 0 {
					t.Errorf("%s: the empty %s is still there", dir, name)
				}
			}
		}
	}
}

// putTestBlob commits blob nthID(i) in its own transaction.
func putTestBlob(t *testing.T, c *Catalog, i int) {
	t.Helper()
	update(t, c, func(tx *Tx) error { return tx.PutBlob(nthID(i), testBlobLocation()) })
}

func testBlobLocation() BlobLocation {
	return BlobLocation{Pack: nthID(1 << 20), Type: 1, Length: 1, RawLength: 1, Compression: 1}
}

// checkRecovered opens the catalog in dir the way the next command after a
// kill would (read-only first, like `turnsnap log`, or writable first; a
// read-only one is followed by a writable one) and checks each open works
// and finds every blob in want; the writable open must also commit.
func checkRecovered(t *testing.T, dir string, readOnlyFirst bool, want []int) {
	t.Helper()
	ctx := context.Background()
	check := func(readOnly bool) {
		t.Helper()
		c, err := Open(ctx, dir, Options{ReadOnly: readOnly, Logger: testLogger(t)})
		if err != nil {
			t.Fatalf("open (read-only %v, read-only first %v) after the kill: %v", readOnly, readOnlyFirst, err)
		}
		defer func() {
			if err := c.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		}()
		view(t, c, func(tx *Tx) error {
			for _, i := range want {
				if _, ok, err := tx.Blob(nthID(i)); !ok || err != nil {
					t.Errorf("blob %d committed before the kill: found %v, %v (read-only %v)", i, ok, err, readOnly)
				}
			}
			return nil
		})
		if !readOnly {
			putTestBlob(t, c, 999)
		}
	}
	if readOnlyFirst {
		check(true)
	}
	check(false)
}

// A catalog damaged beyond what a kill can do (here its MANIFEST's magic is
// overwritten) fails to open naming the directory, as errdefs.ErrCorrupt,
// and says how to get it back from the store.
func TestDamagedCatalogSaysRebuild(t *testing.T) {
	dir := t.TempDir()
	c := openAt(t, dir)
	putTestBlob(t, c, 1)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "MANIFEST"), []byte("not a manifest at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, ro := range []bool{true, false} {
		_, err := Open(context.Background(), dir, Options{ReadOnly: ro, Logger: testLogger(t)})
		if !errors.Is(err, errdefs.ErrCorrupt) {
			t.Fatalf("read-only %v: err %v, want ErrCorrupt", ro, err)
		}
		for _, want := range []string{"catalog " + dir + " is damaged", "turnsnap catalog rebuild"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("read-only %v: error %q does not say %q", ro, err, want)
			}
		}
	}
}

// An encrypted catalog opened with another key is the caller's mistake, not
// damage: the error must not send anyone to rebuild the catalog.
func TestWrongKeyIsNotDamage(t *testing.T) {
	dir := t.TempDir()
	key := func(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }
	c, err := Open(context.Background(), dir, Options{EncryptionKey: key(1), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	putTestBlob(t, c, 1)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ro := range []bool{true, false} {
		_, err := Open(context.Background(), dir, Options{ReadOnly: ro, EncryptionKey: key(2), Logger: testLogger(t)})
		if err == nil || errors.Is(err, errdefs.ErrCorrupt) || strings.Contains(err.Error(), "rebuild") {
			t.Errorf("read-only %v, wrong key: %v, want an error that is not ErrCorrupt", ro, err)
		}
	}
}
