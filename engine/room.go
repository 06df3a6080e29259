package engine

import (
	"fmt"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

// homeReserve is the free space a command that writes must find on the
// home's filesystem before it writes the catalog. Badger writes its log
// through a mmapped file (catalog.Open allocates it: 32 MiB) and flushes
// memtables and compactions the same way; where those page faults cannot
// get a block the process dies of SIGBUS, so turnsnap stops before that
// with errdefs.ErrNoSpace and leaves the home as it was.
const homeReserve = 48 << 20

// checkRoom fails with errdefs.ErrNoSpace if the home's filesystem has
// less than homeReserve (plus need) free.
func (e *Engine) checkRoom(need uint64) error {
	var fs unix.Statfs_t
	if err := unix.Statfs(string(e.home), &fs); err != nil {
		return fmt.Errorf("home %s: %w", e.home, err)
	}
	free := fs.Bavail * uint64(fs.Bsize)
	if free < homeReserve+need {
		return fmt.Errorf("home filesystem is full: %s has %s free, turnsnap needs %s more to write safely "+
			"(free space and retry; read-only commands such as log, status and verify still work): %w",
			e.home, bytesIEC(free), bytesIEC(homeReserve+need-free), errdefs.ErrNoSpace)
	}
	return nil
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
