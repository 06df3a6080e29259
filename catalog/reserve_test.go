package catalog

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/testenv"
	"golang.org/x/sys/unix"
)

// The room model the engine's full-disk check uses: once open, the
// catalog holds its allocated write-ahead log (Held, which df counts as
// used) and asks Reserve for a memtable's flush only, until this process
// has written enough that the memtable may fill and a new, sparse log
// may come (issue 24: the log was counted twice, refusing turns that
// fit). On a real tmpfs, as a home may be.
func TestReserveAndHeld(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=200m"); err != nil {
		testenv.Missing(t, "tmpfs", err.Error())
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	var before unix.Statfs_t
	if err := unix.Statfs(dir, &before); err != nil {
		t.Fatal(err)
	}
	c := openAt(t, dir+"/catalog")
	var after unix.Statfs_t
	if err := unix.Statfs(dir, &after); err != nil {
		t.Fatal(err)
	}
	used := (before.Bavail - after.Bavail) * uint64(after.Frsize)
	if held := c.Held(); held != 2*memTableSize || used < held || used > OpenReserve {
		t.Errorf("after Open: Held %d, filesystem use %d, want the log (%d) and within OpenReserve (%d)", held, used, 2*memTableSize, OpenReserve)
	}
	if r := c.Reserve(); r != memTableSize {
		t.Errorf("Reserve of a fresh catalog: %d, want one memtable's flush (%d)", r, memTableSize)
	}
	// MiBs of writes, as a long-running daemon makes over time.
	value := strings.Repeat("x", 1000)
	write := func(batch int) {
		if err := c.Update(context.Background(), func(tx *Tx) error {
			for i := range 1000 {
				if err := tx.set([]byte(fmt.Sprintf("\xfftest/%d-%d", batch, i)), []byte(value), "test key"); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	write(0)
	write(1)
	if r := c.Reserve(); r != memTableSize {
		t.Errorf("Reserve after ~2 MiB written: %d, want %d", r, memTableSize)
	}
	write(2)
	write(3)
	if r := c.Reserve(); r != 3*memTableSize {
		t.Errorf("Reserve after ~4.5 MiB written, when the memtable may fill: %d, want a flush and a new log (%d)", r, 3*memTableSize)
	}
}
