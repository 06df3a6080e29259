package main

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/hostile"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/upload"
	"golang.org/x/sys/unix"
)

// smallFS mounts a tmpfs of size bytes for the test and unmounts it after
// everything the test registers later has been cleaned up.
func smallFS(t *testing.T, size string) string {
	t.Helper()
	testenv.RequireRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		testenv.Missing(t, "tmpfs", err.Error())
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	return int64(fs.Bavail) * fs.Bsize
}

// fill leaves about leave bytes free on dir's filesystem.
func fill(t *testing.T, dir string, leave int64) string {
	t.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for freeBytes(t, dir) > leave+int64(len(buf)) {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	return p
}

// awaitFreed waits until dir's filesystem has want bytes free again (less
// 1 MiB) after the test removed what it filled it with, and fails naming
// what holds the space if it does not: a process still holding the
// removed filler open, or the sizes of dir's top-level entries. CI once
// saw the checkpoint after the removal find the filesystem still full.
func awaitFreed(t *testing.T, dir string, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for freeBytes(t, dir) < want-1<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d bytes free 10 s after the filler was removed, %d before it was made; %s",
				dir, freeBytes(t, dir), want, spaceHolders(dir))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// spaceHolders describes what may hold dir's space: open files of removed
// files beneath it (any process), and the bytes of each top-level entry.
func spaceHolders(dir string) string {
	var b strings.Builder
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err == nil && strings.HasPrefix(target, dir) && strings.HasSuffix(target, " (deleted)") {
			comm, _ := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(fd)), "comm"))
			fmt.Fprintf(&b, "%s holds %s open (%s); ", fd, target, strings.TrimSpace(string(comm)))
		}
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		var n int64
		filepath.WalkDir(filepath.Join(dir, e.Name()), func(_ string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				if fi, err := d.Info(); err == nil {
					if st, ok := fi.Sys().(*syscall.Stat_t); ok {
						n += st.Blocks * 512
					}
				}
			}
			return nil
		})
		fmt.Fprintf(&b, "%s: %d bytes; ", e.Name(), n)
	}
	return strings.TrimSuffix(b.String(), "; ")
}

func countPacks(t *testing.T, home string) int {
	t.Helper()
	n := 0
	filepath.WalkDir(filepath.Join(home, "store", "packs"), func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return nil
	})
	return n
}

// On a nearly full and then full home filesystem, a checkpoint fails with
// "home filesystem is full" (exit 8) instead of a SIGBUS, removes the packs
// it wrote and leaves the root mounted; read-only commands keep working;
// once space is freed everything works again.
func TestCLIFullHomeFilesystem(t *testing.T) {
	fsDir := smallFS(t, "160m")
	home := filepath.Join(fsDir, "home")
	base := t.TempDir()
	os.WriteFile(filepath.Join(base, "a.txt"), []byte("base\n"), 0o644)
	t.Cleanup(func() { run(t, home, "sandbox", "rm", "s") })
	var created struct{ Root string }
	runJSON(t, home, &created, "sandbox", "create", "s", "--base", base)
	os.WriteFile(filepath.Join(created.Root, "b.txt"), []byte("turn 1\n"), 0o644)
	var c1 struct{ ID string }
	runJSON(t, home, &c1, "checkpoint", "s")
	packs := countPacks(t, home)

	big := make([]byte, 24<<20)
	rand.Read(big)
	if err := os.WriteFile(filepath.Join(created.Root, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	// Room for the packs of the new file, not for the catalog's reserve.
	before := freeBytes(t, fsDir)
	filler := fill(t, fsDir, 30<<20)
	out, code := run(t, home, "checkpoint", "s")
	if code != exitNoSpace || !strings.Contains(out, "home filesystem is full") {
		t.Fatalf("checkpoint on a nearly full home: exit %d: %s", code, out)
	}
	if n := countPacks(t, home); n != packs {
		t.Errorf("a failed checkpoint left %d packs behind", n-packs)
	}
	fill(t, fsDir, 0)
	for _, args := range [][]string{{"checkpoint", "s"}, {"rollback", "s", c1.ID}, {"sandbox", "create", "t", "--base", base}} {
		if out, code := run(t, home, args...); code != exitNoSpace {
			t.Errorf("turnsnap %v on a full home: exit %d, want %d: %s", args, code, exitNoSpace, out)
		}
	}
	if _, err := os.Stat(filepath.Join(created.Root, "b.txt")); err != nil {
		t.Errorf("the root is not as it was after the refused commands: %v", err)
	}
	for _, args := range [][]string{{"log", "s"}, {"sandbox", "list"}, {"status"}, {"tag"}, {"verify", c1.ID}, {"verify", "--store-only"}} {
		if out, code := run(t, home, args...); code != 0 {
			t.Errorf("turnsnap %v on a full home: exit %d: %s", args, code, out)
		}
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	awaitFreed(t, fsDir, before)
	var c2 struct{ ID, Class string }
	if out, code := run(t, home, "checkpoint", "s", "--json"); code != 0 {
		t.Fatalf("checkpoint once space is free: exit %d: %s (%s)", code, out, spaceHolders(fsDir))
	} else if err := json.Unmarshal([]byte(out), &c2); err != nil {
		t.Fatalf("checkpoint once space is free: bad JSON %q: %v", out, err)
	}
	if c2.Class != "fs" {
		t.Fatalf("checkpoint once space is free: %+v", c2)
	}
	if out, code := run(t, home, "verify", c2.ID); code != 0 {
		t.Fatalf("verify after space was freed: exit %d: %s", code, out)
	}
}

// Read-only commands work on a read-only home (here a read-only bind mount
// of a live one); writing commands fail without harm.
func TestCLIReadOnlyHome(t *testing.T) {
	testenv.RequireRoot(t)
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	os.WriteFile(filepath.Join(base, "a.txt"), []byte("base\n"), 0o644)
	var created struct{ Root string }
	runJSON(t, home, &created, "sandbox", "create", "s", "--base", base)
	t.Cleanup(func() { run(t, home, "sandbox", "rm", "s") })
	os.WriteFile(filepath.Join(created.Root, "b.txt"), []byte("turn 1\n"), 0o644)
	var c1 struct{ ID string }
	runJSON(t, home, &c1, "checkpoint", "s")
	ro := t.TempDir()
	if err := unix.Mount(home, ro, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(ro, unix.MNT_DETACH) })
	if err := unix.Mount("", ro, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"log", "s"}, {"sandbox", "list"}, {"status"}, {"tag"}, {"verify", c1.ID}, {"verify", "--store-only"}} {
		if out, code := run(t, ro, args...); code != 0 {
			t.Errorf("turnsnap %v on a read-only home: exit %d: %s", args, code, out)
		}
	}
	if out, code := run(t, ro, "tag", "x", c1.ID); code == 0 {
		t.Errorf("tag on a read-only home succeeded: %s", out)
	}
}

// gc --grace 0 means no grace: a pack no checkpoint references goes at
// once, while the default grace keeps a young one.
func TestCLIGCGraceZero(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := t.Context()
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	os.WriteFile(filepath.Join(base, "a.txt"), []byte("base\n"), 0o644)
	t.Cleanup(func() { run(t, home, "sandbox", "rm", "s") })
	runJSON(t, home, &struct{}{}, "sandbox", "create", "s", "--base", base)
	store, err := upload.NewLocal(filepath.Join(home, "store"))
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := hostile.WritePack(ctx, store, []hostile.Blob{hostile.Plain(delta.BlobData, []byte("nobody's"))})
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Deleted int `json:"packs_deleted"`
	}
	runJSON(t, home, &g, "gc")
	if _, err := store.Stat(ctx, orphan); g.Deleted != 0 || err != nil {
		t.Fatalf("gc with the default grace deleted a young pack (%d deleted, %v)", g.Deleted, err)
	}
	runJSON(t, home, &g, "gc", "--grace", "0")
	if _, err := store.Stat(ctx, orphan); g.Deleted != 1 || err == nil {
		t.Fatalf("gc --grace 0 kept the unreferenced pack (%d deleted)", g.Deleted)
	}
}
