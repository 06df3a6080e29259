package engine

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// fileLinks stats every regular file under root: its link count and its
// (device, inode) identity, by path.
func fileLinks(t *testing.T, root string) map[string]unix.Stat_t {
	t.Helper()
	out := map[string]unix.Stat_t{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		out[rel] = st
		return nil
	})
	must(t, err)
	return out
}

// checkLinks is issue 24, item 5d: inside a sandbox a file's st_nlink counts
// the sandbox's own names for it only. The pair hard/a, hard/b is one
// file in the checkpoint; every other file has one name.
func checkLinks(t *testing.T, what, root string) map[string]unix.Stat_t {
	t.Helper()
	files := fileLinks(t, root)
	if len(files) < 5 {
		t.Fatalf("%s: only %d files", what, len(files))
	}
	for rel, st := range files {
		want := uint64(1)
		if rel == "hard/a" || rel == "hard/b" {
			want = 2
		}
		if uint64(st.Nlink) != want {
			t.Errorf("%s: %s has %d links, want %d", what, rel, st.Nlink, want)
		}
	}
	if a, b := files["hard/a"], files["hard/b"]; a.Ino != b.Ino || a.Dev != b.Dev {
		t.Errorf("%s: the hardlink pair is two inodes", what)
	}
	return files
}

// TestFrozenLayerLinkCounts: after a branch stacked on a frozen layer (one
// made from an earlier layer, sharing its unchanged files) and after a
// rollback, files show the checkpoint's own link counts, and no file of
// one sandbox is a file of another.
func TestFrozenLayerLinkCounts(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	base := t.TempDir()
	write(t, filepath.Join(base, "base.txt"), "base\n")
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: base})
	must(t, err)
	p := func(rel string) string { return filepath.Join(cr.Root, rel) }
	write(t, p("one.txt"), "one\n")
	write(t, p("dir/two.txt"), "two\n")
	write(t, p("dir/three.txt"), "three\n")
	write(t, p("hard/a"), "linked\n")
	must(t, os.Link(p("hard/a"), p("hard/b")))
	write(t, p("base.txt"), "copied up\n")
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	e.WaitFreezes()
	// The next layer is frozen from c1's: its unchanged files are shared.
	write(t, p("dir/four.txt"), "four\n")
	c2, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	e.WaitFreezes()
	cp2, err := e.resolveFor(ctx, "", mustRef(c2.ID.String()))
	must(t, err)
	if !overlayOf(e).Layers().Has(cp2.FSTree) {
		t.Fatal("no frozen layer for the second checkpoint")
	}

	b1, err := e.Branch(ctx, mustRef(c2.ID.String()), "b1", BranchOptions{})
	must(t, err)
	b2, err := e.Branch(ctx, mustRef(c2.ID.String()), "b2", BranchOptions{})
	must(t, err)
	checkLinks(t, "branch b1", b1.Root)
	f2 := checkLinks(t, "branch b2", b2.Root)
	write(t, filepath.Join(b1.Root, "dir/four.txt"), "changed in b1\n")
	if data, _ := os.ReadFile(filepath.Join(b2.Root, "dir/four.txt")); string(data) != "four\n" {
		t.Fatalf("a write in one branch shows in another: %q", data)
	}
	_, err = e.Rollback(ctx, "s", mustRef(c1.ID.String()), RollbackOptions{})
	must(t, err)
	fs := checkLinks(t, "rollback", cr.Root)
	_, err = e.Rollback(ctx, "b1", mustRef(c1.ID.String()), RollbackOptions{})
	must(t, err)
	f1 := checkLinks(t, "rollback of a branch", b1.Root)
	owner := map[[2]uint64]string{}
	for name, files := range map[string]map[string]unix.Stat_t{"b1": f1, "b2": f2, "s": fs} {
		for rel, st := range files {
			k := [2]uint64{st.Dev, st.Ino}
			if other, ok := owner[k]; ok && other != name {
				t.Errorf("%s/%s is a file of sandbox %s too", name, rel, other)
			}
			owner[k] = name
		}
	}
}
