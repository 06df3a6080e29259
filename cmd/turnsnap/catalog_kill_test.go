package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/killpoint"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"golang.org/x/sys/unix"
)

// A turnsnap killed while Badger closes the catalog, at the unlink of the
// memtable it has just flushed (truncated to zero, not yet removed), leaves
// a home that read-only commands (`log`, `tag` listing) answer at once, with
// the killed command's tag, and that the next writer works on. Before the
// fix both failed with Badger's "truncate ...: invalid argument" and
// "Create a new file" until a second writer had run (issue 23).
func TestCLIReadsAfterKillInCatalogClose(t *testing.T) {
	testenv.RequireRoot(t)
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	os.WriteFile(filepath.Join(base, "a.txt"), []byte("base\n"), 0o644)
	t.Cleanup(func() {
		if _, code := run(t, home, "sandbox", "rm", "s"); code != 0 {
			// The catalog did not open (the bug): do not leave the mount.
			unix.Unmount(filepath.Join(home, "sandboxes", "s", "root"), unix.MNT_DETACH)
		}
	})
	var s struct{ Root string }
	runJSON(t, home, &s, "sandbox", "create", "s", "--base", base)
	os.WriteFile(filepath.Join(s.Root, "one"), []byte("1"), 0o644)
	var c1 struct{ ID string }
	runJSON(t, home, &c1, "checkpoint", "s")

	catalog := filepath.Join(home, "catalog")
	killed := ""
	calls, err := killpoint.Run(context.Background(), []string{os.Args[0], "--home", home, "tag", "good", c1.ID},
		[]string{runMainEnv + "=1"}, []*os.File{nil, os.Stderr, os.Stderr}, catalog,
		func(call string) bool {
			if strings.HasPrefix(call, "unlink ") && strings.HasSuffix(call, ".mem") {
				killed = call
			}
			return killed != ""
		})
	if errors.Is(err, killpoint.ErrUnsupported) {
		testenv.Missing(t, "ptrace and seccomp", err.Error())
	}
	if err != nil || killed == "" {
		t.Fatalf("tag under the tracer: %v, never unlinked a memtable: %q", err, calls)
	}
	mem := filepath.Join(catalog, strings.TrimPrefix(killed, "unlink "))
	if fi, err := os.Stat(mem); err != nil || fi.Size() != 0 {
		t.Fatalf("killed at %q: want the memtable there and empty: %v %v", killed, fi, err)
	}

	var l []struct{ ID string }
	runJSON(t, home, &l, "log", "s")
	if len(l) != 2 || l[0].ID != c1.ID { // c1, then the creation's checkpoint
		t.Fatalf("log after the kill: %+v, want %s first of two", l, c1.ID)
	}
	if out, code := run(t, home, "tag"); code != 0 || !strings.Contains(out, "good") {
		t.Fatalf("tags after the kill (exit %d): %q, want the killed command's tag", code, out)
	}
	if out, code := run(t, home, "tag", "better", c1.ID); code != 0 {
		t.Fatalf("the first writer after the kill: exit %d: %s", code, out)
	}
}
