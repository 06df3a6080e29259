package engine

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/btrfstest"
)

// TestSkipNeverCommitsUnstoredTrees: a turn whose merged state equals the
// head's is a skip even when its scan's trees differ from the head's (a
// directory's mtime moved: a file made and removed in it), and a skip
// stores nothing. If that scan also read a file (touched but equal: a
// chown to the same owner), it must still not become the root's committed
// scan: the next turn would take the unchanged directory's tree from it by
// ID, and its checkpoint would name a tree in no pack. Every checkpoint of
// the home must verify from the store alone, on both backends.
func TestSkipNeverCommitsUnstoredTrees(t *testing.T) {
	base := richBase(t)
	overlayOpts := func(*testing.T) CreateOptions { return CreateOptions{Base: base} }
	for _, tc := range []struct {
		name    string
		tracked bool // the daemon's engine (Options.TrackChanges)
		opts    func(t *testing.T) CreateOptions
	}{
		{"overlay", false, overlayOpts},
		{"overlay/tracked", true, overlayOpts},
		{"btrfs", false, func(t *testing.T) CreateOptions { return btrfsOpts(btrfstest.Pool(t), base) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			e := newEngine(t)
			if tc.tracked {
				e = openTracking(t, filepath.Join(t.TempDir(), "home"))
			}
			cr, err := e.CreateSandbox(ctx, "s", tc.opts(t))
			must(t, err)
			p := func(rel string) string { return filepath.Join(cr.Root, rel) }
			must(t, os.MkdirAll(p("work/deep"), 0o755))
			write(t, p("work/a.txt"), "a\n")
			write(t, p("work/deep/b.txt"), "b\n")
			write(t, p("other/c.txt"), "c\n")
			settle()
			_, err = e.Checkpoint(ctx, "s", CheckpointOptions{})
			must(t, err)
			settle()
			// Touched, equal: a chown to the same owner moves the ctime.
			must(t, os.Chown(p("work/a.txt"), os.Getuid(), os.Getgid()))
			// work/deep's mtime moves; nothing in it does.
			write(t, p("work/deep/tmp"), "gone soon\n")
			must(t, os.Remove(p("work/deep/tmp")))
			settle()
			skip, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
			must(t, err)
			if skip.Class != delta.ClassSkip || skip.Stats.FilesRead == 0 {
				t.Fatalf("the touched turn: %s, read %d files; the test needs a skip that read a file", skip.Class, skip.Stats.FilesRead)
			}
			write(t, p("other/c.txt"), "c, changed\n")
			settle()
			next, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
			must(t, err)
			if next.Class == delta.ClassSkip {
				t.Fatal("the turn after the skip changed a file and was skipped")
			}
			checkAll(t, e)
			if _, err := e.Verifier().VerifyStore(ctx, mustRef("")); err != nil {
				t.Fatalf("after a skip that read a file: %v", err)
			}
		})
	}
}
