package overlay

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// newRoot makes a root on a lower directory built by fill.
func newRoot(t *testing.T, fill func(lower string)) (*Root, string, string) {
	t.Helper()
	testenv.RequireRoot(t)
	lower := filepath.Join(t.TempDir(), "lower")
	must(t, os.Mkdir(lower, 0o755))
	fill(lower)
	dir := filepath.Join(t.TempDir(), "sb")
	r, err := Create(context.Background(), dir, lower, delta.EmptyTree(), roottest.NewMemStore())
	must(t, err)
	t.Cleanup(func() { r.Remove(context.Background()) })
	return r, dir, lower
}

// TestMountPinsEveryOption checks the kernel really runs the root with
// every pinned feature (mountinfo lists the super options it got).
func TestMountPinsEveryOption(t *testing.T) {
	r, _, _ := newRoot(t, func(string) {})
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(r.Path()))
	must(t, err)
	if len(ms) != 1 {
		t.Fatalf("%d mounts on the root", len(ms))
	}
	for _, o := range []string{"redirect_dir=on", "index=on", "nfs_export=on", "uuid=on"} {
		if !strings.Contains(","+ms[0].VFSOptions+",", ","+o+",") {
			t.Errorf("mounted without %s: %s", o, ms[0].VFSOptions)
		}
	}
	for _, o := range []string{"metacopy=on", "xino=on", "xino=auto"} {
		if strings.Contains(ms[0].VFSOptions, o) {
			t.Errorf("mounted with %s: %s", o, ms[0].VFSOptions)
		}
	}
}

// TestToolsRenameBaseDirectories runs the tools that broke with EXDEV
// before redirect_dir was pinned: git mv and Python's os.rename of a
// directory that comes from the base.
func TestToolsRenameBaseDirectories(t *testing.T) {
	for _, tool := range []string{"git", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, tool, "the rename tests run it inside a sandbox root")
		}
	}
	run := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	r, _, _ := newRoot(t, func(lower string) {
		roottest.Write(t, filepath.Join(lower, "pkg/a/one.go"), "package a\n")
		roottest.Write(t, filepath.Join(lower, "pkg/b/two.go"), "package b\n")
		run(lower, "git", "init", "-q")
		run(lower, "git", "add", ".")
		run(lower, "git", "commit", "-qm", "base")
	})
	root := r.Path()
	run(root, "git", "mv", "pkg/a", "pkg/renamed")
	run(root, "python3", "-c", "import os; os.rename('pkg/b', 'moved')")
	for _, p := range []string{"pkg/renamed/one.go", "moved/two.go"} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Fatalf("after the renames: %v", err)
		}
	}
	store := roottest.NewMemStore()
	res, err := r.Scan(context.Background(), store)
	must(t, err)
	want := roottest.Merged(t, root)
	dir2 := filepath.Join(t.TempDir(), "copy")
	c, err := Create(context.Background(), dir2, r.lower, res.Root, store)
	must(t, err)
	defer c.Remove(context.Background())
	if got := roottest.Merged(t, c.Path()); got != want {
		t.Fatalf("a root made from the layer hashes to %s, the live one to %s", got.Short(), want.Short())
	}
	run(c.Path(), "git", "status", "--short") // the index and objects came along
}

// TestMountOnAnotherBaseCopyIsRefused replaces the lower by a copy with
// the same content and new inodes: index=on,uuid=on make overlay refuse
// the old upper (ESTALE), which must be a clear precondition error.
func TestMountOnAnotherBaseCopyIsRefused(t *testing.T) {
	r, dir, lower := newRoot(t, func(lower string) {
		roottest.Write(t, filepath.Join(lower, "f"), "base\n")
	})
	roottest.Write(t, filepath.Join(r.Path(), "f"), "changed\n")
	store := roottest.NewMemStore()
	head, err := r.Scan(context.Background(), store)
	must(t, err)
	must(t, r.Unmount(context.Background()))
	must(t, os.Rename(lower, lower+".old"))
	if out, err := exec.Command("cp", "-a", lower+".old", lower).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	err = Open(dir, lower).Mount(context.Background())
	if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), "another copy of base") {
		t.Fatalf("mount on a copied base: %v, want a precondition error naming the cause", err)
	}
	// The remedy the error names: restoring the head builds a new layer.
	must(t, Open(dir, lower).Restore(context.Background(), head.Root, store))
	if data, err := os.ReadFile(filepath.Join(r.Path(), "f")); err != nil || string(data) != "changed\n" {
		t.Fatalf("after restoring the head: %q, %v", data, err)
	}
}

// TestIndexedBaseHardlinksAreRecorded writes through one name of a base
// hardlink. With index=on every name then shows the new content, though
// only the written name is in the upper; the layer must say so for each
// name, also after the written name is deleted.
func TestIndexedBaseHardlinksAreRecorded(t *testing.T) {
	r, _, _ := newRoot(t, func(lower string) {
		roottest.Write(t, filepath.Join(lower, "a/one"), "base\n")
		must(t, os.MkdirAll(filepath.Join(lower, "b"), 0o755))
		must(t, os.Link(filepath.Join(lower, "a/one"), filepath.Join(lower, "b/two")))
	})
	f, err := os.OpenFile(filepath.Join(r.Path(), "a/one"), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	f.WriteString("appended\n")
	f.Close()
	if data, _ := os.ReadFile(filepath.Join(r.Path(), "b/two")); string(data) != "base\nappended\n" {
		t.Fatalf("the other name shows %q: this kernel does not index hardlinks as expected", data)
	}
	store := roottest.NewMemStore()
	check := func(step string) {
		t.Helper()
		want := roottest.Merged(t, r.Path())
		res, err := r.Scan(context.Background(), store)
		must(t, err)
		c, err := Create(context.Background(), filepath.Join(t.TempDir(), "copy"), r.lower, res.Root, store)
		must(t, err)
		defer c.Remove(context.Background())
		if got := roottest.Merged(t, c.Path()); got != want {
			t.Fatalf("%s: a root made from the layer hashes to %s, the live one to %s", step, got.Short(), want.Short())
		}
	}
	check("after the write")
	must(t, os.Remove(filepath.Join(r.Path(), "a/one")))
	check("after deleting the written name")
	// Written and deleted before any scan: no name of the file is left in
	// the upper, only its index entry.
	r2, _, _ := newRoot(t, func(lower string) {
		roottest.Write(t, filepath.Join(lower, "a/one"), "base\n")
		must(t, os.MkdirAll(filepath.Join(lower, "b"), 0o755))
		must(t, os.Link(filepath.Join(lower, "a/one"), filepath.Join(lower, "b/two")))
	})
	roottest.Write(t, filepath.Join(r2.Path(), "a/one"), "rewritten in place\n")
	must(t, os.Remove(filepath.Join(r2.Path(), "a/one")))
	r = r2
	check("after a write and a delete in one turn")
}

// holdCopy starts a process in a new mount namespace made while r is
// mounted, so the namespace keeps a copy of r's overlay; it returns once
// the copy exists.
func holdCopy(t *testing.T, r *Root) *exec.Cmd {
	t.Helper()
	if _, err := exec.LookPath("unshare"); err != nil {
		testenv.Missing(t, "unshare", "the test holds a mount in another namespace")
	}
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "60")
	must(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	g, err := r.gen()
	must(t, err)
	want := " overlay " + mountSource(filepath.Join(g, "upper")) + " "
	self, _ := os.Readlink("/proc/self/ns/mnt")
	for i := 0; ; i++ {
		ns, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "ns/mnt"))
		data, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "mountinfo"))
		if ns != self && strings.Contains(string(data), want) {
			return cmd
		}
		if i == 1000 {
			t.Fatal("the holder never got its own namespace with the root in it")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMountWhileAnotherNamespaceHoldsTheUpper: index=on refuses to mount an
// upper that a copy of the previous mount in another namespace still uses.
// The refusal names the holder; once the holder is gone, the retry mounts.
func TestMountWhileAnotherNamespaceHoldsTheUpper(t *testing.T) {
	r, dir, lower := newRoot(t, func(lower string) {
		roottest.Write(t, filepath.Join(lower, "f"), "base\n")
	})
	holder := holdCopy(t, r)
	must(t, r.Unmount(context.Background()))
	err := Open(dir, lower).Mount(context.Background())
	if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(holder.Process.Pid)) {
		t.Fatalf("mount while another namespace holds the upper: %v, want a precondition error naming pid %d", err, holder.Process.Pid)
	}
	// The holder goes away while Mount retries: the retry succeeds.
	r2 := Open(dir, lower)
	busy := 0
	r2.onBusy = func() {
		if busy++; busy == 1 {
			holder.Process.Kill()
			holder.Wait()
		}
	}
	must(t, r2.Mount(context.Background()))
	if busy == 0 {
		t.Fatal("the mount was never refused: the test did not hold the upper")
	}
	if data, err := os.ReadFile(filepath.Join(r2.Path(), "f")); err != nil || string(data) != "base\n" {
		t.Fatalf("after the retried mount: %q, %v", data, err)
	}
}
