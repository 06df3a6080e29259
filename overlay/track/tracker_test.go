package track_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/overlay"
	"github.com/turnsnap/turnsnap/overlay/track"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// mountedRoot is an overlay root, mounted, on a base of one file ("top"),
// which is all a tracker needs: a mount with nfs_export.
func mountedRoot(t *testing.T) *overlay.Root {
	t.Helper()
	testenv.RequireRoot(t)
	lower := filepath.Join(t.TempDir(), "lower")
	roottest.Write(t, filepath.Join(lower, "top"), "top\n")
	r, err := overlay.Create(context.Background(), filepath.Join(t.TempDir(), "sb"), lower, delta.EmptyTree(), roottest.NewMemStore())
	must(t, err)
	t.Cleanup(func() { r.Remove(context.Background()) })
	return r
}

// TestTrackerDrainsInBackground: events leave the kernel queue without a
// Changes call (the drain goroutine, woken by Go's poller), so a turn's
// burst need not fit the queue all at once; Close stops it.
func TestTrackerDrainsInBackground(t *testing.T) {
	r := mountedRoot(t)
	tr, err := track.Start("sb", r.Path(), track.Options{})
	must(t, err)
	for i := range 100 {
		must(t, os.WriteFile(filepath.Join(r.Path(), fmt.Sprintf("bg%d", i)), nil, 0o644))
	}
	deadline := time.Now().Add(10 * time.Second)
	for tr.Stats().Events < 100 {
		if time.Now().After(deadline) {
			t.Fatalf("the drain read %d events of at least 100", tr.Stats().Events)
		}
		time.Sleep(5 * time.Millisecond)
	}
	tr.Changes()
	tr.Reset(&fstree.ScanResult{})
	must(t, tr.Close())
	must(t, tr.Close()) // idempotent
	if _, why := tr.Changes(); why != track.ReasonClosed {
		t.Fatalf("a closed tracker's record: %q", why)
	}
}

// TestTrackerQuietDropsOnlyItsProcess: while Quiet(self) holds, this
// process's writes make no change in the record, another process's
// writes at the same time do, and after end this process's writes count
// again.
func TestTrackerQuietDropsOnlyItsProcess(t *testing.T) {
	r := mountedRoot(t)
	tr, err := track.Start("sb", r.Path(), track.Options{})
	must(t, err)
	defer tr.Close()
	tr.Reset(&fstree.ScanResult{}) // a base, so Changes answers
	root := r.Path()
	roottest.Write(t, filepath.Join(root, "before"), "recorded\n")
	end := tr.Quiet(os.Getpid())
	roottest.Write(t, filepath.Join(root, "mine"), "dropped\n")
	must(t, os.Chmod(filepath.Join(root, "top"), 0o600))
	// A child process writes while the quiet window is open.
	if out, err := exec.Command("sh", "-c", "echo other > "+filepath.Join(root, "other")).CombinedOutput(); err != nil {
		t.Fatalf("child write: %v: %s", err, out)
	}
	end()
	roottest.Write(t, filepath.Join(root, "after"), "recorded\n")
	paths, why := tr.Changes()
	if why != "" {
		t.Fatalf("record unknown: %s", why)
	}
	for _, p := range []string{"before", "other", "after"} {
		if !slices.Contains(paths, p) {
			t.Errorf("%s is missing from the record %v", p, paths)
		}
	}
	for _, p := range []string{"mine", "top"} {
		if slices.Contains(paths, p) {
			t.Errorf("%s, written inside the quiet window, is in the record %v", p, paths)
		}
	}
}
