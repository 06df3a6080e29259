package proc

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// overlayRoot mounts an overlay with lower as its base, as turnsnap's
// overlay sandbox roots are, and unmounts it when the test ends.
func overlayRoot(t *testing.T, lower string) string {
	t.Helper()
	dir := t.TempDir()
	upper, work, merged := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "merged")
	for _, d := range []string{upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(merged, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", merged, err)
		}
	})
	return merged
}

// TestOverlayRoots: the sandbox roots turnsnap uses are overlay mounts; a
// container on one checkpoints, and restores onto another overlay of the
// same base.
func TestOverlayRoots(t *testing.T) {
	rt := newRuntime(t)
	ctx := testCtx(t)
	base := busyboxRootfs(t)
	root := overlayRoot(t, base)
	id := newID(t, rt) // registered after the mount: deleted before unmounting
	if err := rt.Start(ctx, id, root, StartOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.ExecDetached(ctx, id, counterLoop, DetachOptions{Log: "/tmp/loop.log"}); err != nil {
		t.Fatal(err)
	}
	counter := filepath.Join(root, "tmp", "counter")
	waitFor(t, 10*time.Second, "the counter to reach 20", func() bool { v, _ := readInt(counter); return v >= 20 })
	v := pausedCount(t, rt, id, root)
	img := filepath.Join(t.TempDir(), "img")
	if _, err := rt.Checkpoint(ctx, id, img, DumpOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := rt.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	// The branch's root: the same base, the original's files as of the cut
	// (the log the loop holds open must be there with its size).
	branch := overlayRoot(t, base)
	for _, f := range []string{"tmp/loop.log"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(branch, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rid := newID(t, rt)
	if _, err := rt.Restore(ctx, rid, branch, img, RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	bc := filepath.Join(branch, "tmp", "counter")
	waitFor(t, 10*time.Second, "the branch to count on from the image", func() bool { n, _ := readInt(bc); return n > v })
}
