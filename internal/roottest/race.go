package roottest

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// testScanRacingSymlinkSwap checkpoints while a writer in the sandbox keeps
// exchanging a directory with a symlink to a host directory: no committed
// checkpoint may ever hold a byte of the host's file.
func testScanRacingSymlinkSwap(t *testing.T, s Setup) {
	f := newFixture(t, s)
	r, _ := f.create("sb", f.s.IDs.EmptyTree())
	host := t.TempDir()
	secret := []byte("HOST SECRET " + strings.Repeat("h", 64))
	must(t, os.WriteFile(filepath.Join(host, "passwd"), secret, 0o644))
	p := func(rel string) string { return filepath.Join(r.Path(), rel) }
	Write(t, p("race/x/passwd"), "sandbox\n")
	Write(t, p("src/x/passwd"), "sandbox too\n") // below a base directory
	must(t, os.Symlink(host, p("link")))
	var stop atomic.Bool
	var swaps atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			d := p([]string{"race/x", "src/x"}[i%2])
			if err := unix.Renameat2(unix.AT_FDCWD, p("link"), unix.AT_FDCWD, d, unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("exchange: %v", err)
				return
			}
			swaps.Add(1)
		}
	}()
	defer func() { stop.Store(true); wg.Wait() }()
	committed := 0
	for range 40 {
		res, err := r.Scan(f.ctx, f.store)
		if err != nil {
			continue // an entry that kept changing: that turn fails, nothing commits
		}
		must(t, r.Committed(res))
		committed++
		if f.store.Holds(secret) {
			t.Fatal("a checkpoint racing a symlink swap holds a host file's content")
		}
	}
	stop.Store(true)
	wg.Wait()
	if committed == 0 || swaps.Load() == 0 {
		t.Fatalf("%d checkpoints committed, %d swaps: the race did not run", committed, swaps.Load())
	}
}
