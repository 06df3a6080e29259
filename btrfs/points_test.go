package btrfs

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/roottest"
)

func TestRestorePointsArePruned(t *testing.T) {
	s := newSandbox(t, Options{Keep: 3})
	var trees []delta.ID
	for i := range 6 {
		roottest.Write(t, filepath.Join(s.r.Path(), "n"), fmt.Sprint(i))
		trees = append(trees, s.checkpoint().Root)
	}
	pts, err := s.r.RestorePoints()
	must(t, err)
	if len(pts) != 3 {
		t.Fatalf("%d restore points kept, want 3", len(pts))
	}
	for _, tr := range trees[3:] {
		found := false
		for _, p := range pts {
			found = found || p == tr
		}
		if !found {
			t.Fatalf("newest point %s was pruned", tr.Short())
		}
	}
}

// TestCrashLeftoversAreCleared plants what interrupted operations leave and
// checks that the next mount clears or finishes each.
func TestCrashLeftoversAreCleared(t *testing.T) {
	s := newSandbox(t, Options{})
	roottest.Write(t, filepath.Join(s.r.Path(), "f"), "1")
	c1 := s.checkpoint()
	roottest.Write(t, filepath.Join(s.r.Path(), "f"), "2")
	c2 := s.checkpoint()
	want := roottest.Merged(t, s.r.Path())
	sbDir, g, err := s.r.gen()
	must(t, err)
	snaps := filepath.Join(sbDir, "snaps")
	// A restore that crashed before switching generations.
	stale := filepath.Join(sbDir, "gen-crashed")
	must(t, os.Mkdir(stale, 0o700))
	must(t, snapshot(filepath.Join(g, "live"), filepath.Join(stale, "live"), false))
	// A scan whose checkpoint never committed.
	scan := filepath.Join(sbDir, ".scan-crashed")
	must(t, os.Mkdir(scan, 0o700))
	must(t, snapshot(filepath.Join(g, "live"), filepath.Join(scan, "root"), true))
	// A point set aside for a replacement that never came (put back), and
	// one whose replacement is in place (deleted).
	must(t, os.Rename(filepath.Join(snaps, c1.Root.String()), filepath.Join(snaps, ".rm-a")))
	must(t, os.Mkdir(filepath.Join(snaps, ".rm-b"), 0o700))
	must(t, snapshot(filepath.Join(snaps, c2.Root.String(), "root"), filepath.Join(snaps, ".rm-b", "root"), true))
	data, err := os.ReadFile(filepath.Join(snaps, c2.Root.String(), "info.json"))
	must(t, err)
	must(t, os.WriteFile(filepath.Join(snaps, ".rm-b", "info.json"), data, 0o600))

	must(t, s.r.Unmount(s.ctx))
	must(t, s.r.Mount(s.ctx))
	for _, p := range []string{stale, scan, filepath.Join(snaps, ".rm-a"), filepath.Join(snaps, ".rm-b")} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s survived the mount", p)
		}
	}
	if !validPoint(filepath.Join(snaps, c1.Root.String()), c1.Root, pointBase(t, snaps, c2.Root)) {
		t.Error("the point set aside was not put back")
	}
	if got := roottest.Merged(t, s.r.Path()); got != want {
		t.Fatal("recovery changed the root")
	}
	must(t, s.r.Restore(s.ctx, c1.Root, noLoader{}))
}

func pointBase(t *testing.T, snaps string, tree delta.ID) delta.ID {
	pi, err := readPointInfo(filepath.Join(snaps, tree.String()))
	must(t, err)
	return pi.Base
}

func TestReplaceDirPutsBackOnFailure(t *testing.T) {
	dir := t.TempDir()
	dst := filepath.Join(dir, "dst")
	must(t, os.Mkdir(dst, 0o700))
	must(t, os.WriteFile(filepath.Join(dst, "old"), nil, 0o600))
	if err := replaceDir(filepath.Join(dir, "missing"), dst); err == nil {
		t.Fatal("replacing with a missing directory succeeded")
	}
	if _, err := os.Stat(filepath.Join(dst, "old")); err != nil {
		t.Fatalf("the old directory was not put back: %v", err)
	}
	src := filepath.Join(dir, "src")
	must(t, os.Mkdir(src, 0o700))
	must(t, os.WriteFile(filepath.Join(src, "new"), nil, 0o600))
	must(t, replaceDir(src, dst))
	if _, err := os.Stat(filepath.Join(dst, "new")); err != nil {
		t.Fatal("replacement not in place")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("replace left %d entries", len(entries))
	}
}
