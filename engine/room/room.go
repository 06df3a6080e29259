// Package room checks, before a write, that the home's filesystem keeps
// room for the catalog, and says how full it is as df would.
package room

import (
	"fmt"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

// The home's filesystem must keep room for the catalog: Badger writes
// through mmapped files, and where a page fault cannot get a block the
// process dies of SIGBUS, so turnsnap stops before that with
// errdefs.ErrNoSpace and leaves the home as it was. Before the catalog is
// open that room is catalog.OpenReserve (the write-ahead log Open
// allocates, 32 MiB, and a memtable's flush, 16 MiB: the README's "needs
// 48 MiB free"); once it is open, the log is held already and the room is
// the catalog's Reserve (16 MiB, 48 MiB once a long-running process may
// fill a memtable).

// Check fails with errdefs.ErrNoSpace if the home's filesystem lacks
// the catalog's reserve plus need, the bytes the caller is about to
// write. held is what this command has written already and gives back if
// it fails (a turn's packs). The error's figures are df's: the free space
// it reports counts held and the catalog's own log (Close gives it back)
// as free, which is what df shows once the command has exited, and what
// it needs is all of them plus the reserve.
// home is the home directory; cat is its catalog, nil before it is open.
func Check(home string, cat *catalog.Catalog, need, held uint64) error {
	var fs unix.Statfs_t
	if err := unix.Statfs(home, &fs); err != nil {
		return fmt.Errorf("home %s: %w", home, err)
	}
	free := AvailBytes(&fs)
	reserve := uint64(catalog.OpenReserve)
	if cat != nil {
		reserve = cat.Reserve()
	}
	if free >= reserve+need {
		return nil
	}
	var log uint64 // only for the message: it lists the catalog's files
	if cat != nil {
		log = cat.Held()
	}
	have := free + held + log
	total := held + need + log + reserve
	now := ""
	if held+log > 0 {
		now = fmt.Sprintf(" (%s now, while this command holds %s of it)", bytesIEC(free), bytesIEC(held+log))
	}
	return fmt.Errorf("home filesystem is full: %s has %s free as df shows it%s, and turnsnap needs %s: %s to write "+
		"and %s for the catalog (its log and the room its writes must find); free %s more and retry (read-only "+
		"commands such as log, status and verify still work): %w",
		home, bytesIEC(have), now, bytesIEC(total), bytesIEC(held+need), bytesIEC(log+reserve), bytesIEC(total-have), errdefs.ErrNoSpace)
}

// AvailBytes is the space an unprivileged writer may still use, as df
// prints it: f_bavail counts blocks of f_frsize (f_bsize is only the
// preferred I/O size, and differs on some filesystems).
func AvailBytes(fs *unix.Statfs_t) uint64 {
	unit := uint64(fs.Frsize)
	if unit == 0 {
		unit = uint64(fs.Bsize)
	}
	return fs.Bavail * unit
}

func bytesIEC(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
