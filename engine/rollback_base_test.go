package engine

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"golang.org/x/sys/unix"
)

// TestRollbackOfBaseFilesThroughTheMount: rollbacks that undo and redo an
// agent's edits to the base's own files (an edited file, a deleted one, a
// chmod, an xattr, a symlink replaced by a file, a file in a base
// subdirectory) are written through the mounted root (fstree's
// diffbase.go), which stays mounted: the sandbox sees exactly the
// checkpoint's files, the receipt matches, the next turn is a skip, a
// later turn's checkpoint and a branch of it hold the same files, and the
// store verifies. A rollback that restores a removed base directory still
// unmounts, and its result is exact too; a redo of edits below a base
// directory the upper lacks after it goes through the mount again.
// Tracked (the daemon) and walked (the CLI).
func TestRollbackOfBaseFilesThroughTheMount(t *testing.T) {
	for _, tracked := range []bool{true, false} {
		name := "walk"
		if tracked {
			name = "tracked"
		}
		t.Run(name, func(t *testing.T) { baseRollbacks(t, tracked) })
	}
}

func baseRollbacks(t *testing.T, tracked bool) {
	ctx := context.Background()
	home := filepath.Join(t.TempDir(), "home")
	var e *Engine
	if tracked {
		e = openTracking(t, home)
	} else {
		e = openEngine(t, home)
	}
	base := t.TempDir()
	write(t, filepath.Join(base, "README"), "the base's readme\n")
	write(t, filepath.Join(base, "gone.txt"), "deleted by the agent\n")
	write(t, filepath.Join(base, "docs/guide.md"), "the guide\n")
	write(t, filepath.Join(base, "pkg/a.go"), "package pkg\n")
	write(t, filepath.Join(base, "bin/tool"), "#!/bin/sh\n")
	must(t, os.Chmod(filepath.Join(base, "bin/tool"), 0o755))
	must(t, unix.Lsetxattr(filepath.Join(base, "bin/tool"), "user.kind", []byte("tool"), 0))
	must(t, os.Symlink("README", filepath.Join(base, "link")))
	old := int64(1_600_000_000_000_000_000)
	for _, p := range []string{"README", "gone.txt", "docs/guide.md", "bin/tool"} {
		must(t, unix.UtimesNano(filepath.Join(base, p), []unix.Timespec{unix.NsecToTimespec(old), unix.NsecToTimespec(old)}))
	}
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: base})
	must(t, err)
	root := cr.Root
	type point struct {
		id     string
		merged delta.ID
	}
	take := func() point {
		t.Helper()
		settle()
		merged := mergedState(t, root)
		res, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
		must(t, err)
		return point{res.ID.String(), merged}
	}
	rollback := func(to point, mounted bool, what string) {
		t.Helper()
		res, err := e.Rollback(ctx, "s", mustRef(to.id), RollbackOptions{})
		must(t, err)
		if res.Mounted != mounted {
			t.Fatalf("%s: written through the mount: %v, want %v (live state %s)", what, res.Mounted, mounted, res.LiveScan)
		}
		if tracked && res.LiveScan != "tracked" {
			t.Fatalf("%s: live state by %q", what, res.LiveScan)
		}
		if !res.Receipt.OK {
			t.Fatalf("%s: receipt: %+v", what, res.Receipt.Files)
		}
		if got := mergedState(t, root); got != to.merged {
			t.Fatalf("%s: the root is not the checkpoint's", what)
		}
		next, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
		must(t, err)
		if next.Class != delta.ClassSkip {
			t.Fatalf("%s: the turn after it is %s, want skip", what, next.Class)
		}
	}

	write(t, filepath.Join(root, "agent.txt"), "the agent's\n")
	write(t, filepath.Join(root, "docs/guide.md"), "edited by turn 1\n") // a copy-up both states hold
	c1 := take()
	write(t, filepath.Join(root, "README"), "edited by turn 2\n")
	must(t, os.Remove(filepath.Join(root, "gone.txt")))
	must(t, os.Chmod(filepath.Join(root, "bin/tool"), 0o700))
	must(t, unix.Lsetxattr(filepath.Join(root, "bin/tool"), "user.kind", []byte("edited"), 0))
	must(t, os.Remove(filepath.Join(root, "link")))
	write(t, filepath.Join(root, "link"), "a file now\n")
	write(t, filepath.Join(root, "docs/guide.md"), "edited by turn 2\n")
	write(t, filepath.Join(root, "agent.txt"), "the agent's, turn 2\n")
	c2 := take()
	readme := inode(t, filepath.Join(root, "README"))

	rollback(c1, true, "undo the base edits")
	if inode(t, filepath.Join(root, "README")) != readme {
		t.Fatal("the base copy of README is a new inode: the upper's was not rewritten in place")
	}
	rollback(c2, true, "redo them")
	rollback(c1, true, "undo them again")
	// Uncommitted edits of base files, then a rollback to where they were
	// never made.
	write(t, filepath.Join(root, "README"), "uncommitted\n")
	must(t, os.Remove(filepath.Join(root, "pkg/a.go")))
	rollback(c1, true, "undo uncommitted base edits")

	// A turn after the copies: its checkpoint, and a branch of it, are the
	// same files.
	write(t, filepath.Join(root, "agent2.txt"), "turn 3\n")
	c3 := take()
	br, err := e.Branch(ctx, mustRef(c3.id), "b", BranchOptions{})
	must(t, err)
	if got := mergedState(t, br.Root); got != c3.merged {
		t.Fatal("the branch of the turn after the base rollbacks is not its files")
	}

	// A removed base directory comes back only by the unmounted path, and
	// that path drops the copies the target lacks.
	must(t, os.RemoveAll(filepath.Join(root, "pkg")))
	take()
	rollback(c1, false, "restore a removed base directory")
	// The remount dropped the copies (bin/ among them): redoing an edit
	// below a base directory the upper lacks writes into the merged
	// directory, which overlay copies up.
	rollback(c2, true, "base edits after the remount")
	rollback(c1, true, "undo after the remount")
	if _, err := e.Verifier().VerifyStore(ctx, mustRef("")); err != nil {
		t.Fatalf("store verify: %v", err)
	}
}

// TestRollbackOfBaseFilesUnmountedWhereACopyCannotBeExact: base files a
// copy through the mount would not equal (a hardlinked one, a sparse one)
// and more than fstree.MaxBaseCopyBytes to copy back take the unmounted
// path, and the root is the checkpoint's after each.
func TestRollbackOfBaseFilesUnmountedWhereACopyCannotBeExact(t *testing.T) {
	ctx := context.Background()
	e := openTracking(t, filepath.Join(t.TempDir(), "home"))
	base := t.TempDir()
	write(t, filepath.Join(base, "linked"), "two names\n")
	must(t, os.Link(filepath.Join(base, "linked"), filepath.Join(base, "linked2")))
	sparse, err := os.Create(filepath.Join(base, "sparse"))
	must(t, err)
	_, err = sparse.WriteAt([]byte("the end\n"), 4<<20)
	must(t, err)
	must(t, sparse.Close())
	big := make([]byte, fstree.MaxBaseCopyBytes+1)
	must(t, os.WriteFile(filepath.Join(base, "big"), big, 0o644))
	write(t, filepath.Join(base, "README"), "readme\n")
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: base})
	must(t, err)
	write(t, filepath.Join(cr.Root, "agent.txt"), "turn 1\n")
	settle()
	merged := mergedState(t, cr.Root)
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	for _, name := range []string{"linked", "sparse", "big", "README"} {
		write(t, filepath.Join(cr.Root, name), "edited\n")
		_, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
		must(t, err)
		res, err := e.Rollback(ctx, "s", mustRef(c1.ID.String()), RollbackOptions{})
		must(t, err)
		if want := name == "README"; res.Mounted != want {
			t.Fatalf("undoing an edit to %s: written through the mount: %v, want %v", name, res.Mounted, want)
		}
		if !res.Receipt.OK || mergedState(t, cr.Root) != merged {
			t.Fatalf("undoing an edit to %s: the root is not the checkpoint's", name)
		}
	}
}
