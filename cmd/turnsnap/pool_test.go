package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/btrfstest"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// A fresh home never reuses the btrfs pool path another home recorded:
// branching such a checkpoint asks for --btrfs-pool, the other home's
// sandbox is refused with a way out, and rm --catalog-only forgets it
// without touching the root on the home that has it.
func TestCLIForeignBtrfsPool(t *testing.T) {
	testenv.RequireRoot(t)
	pool := btrfstest.Pool(t)
	os.Mkdir(filepath.Join(pool, "one"), 0o700)
	os.Mkdir(filepath.Join(pool, "two"), 0o700)
	dir := t.TempDir()
	h1, h2 := filepath.Join(dir, "h1"), filepath.Join(dir, "h2")
	base := filepath.Join(dir, "base")
	os.MkdirAll(base, 0o755)
	os.WriteFile(filepath.Join(base, "a"), []byte("a\n"), 0o644)
	t.Cleanup(func() {
		run(t, h2, "sandbox", "rm", "mine")
		run(t, h1, "sandbox", "rm", "s")
	})
	var s struct{ Root string }
	runJSON(t, h1, &s, "sandbox", "create", "s", "--base", base, "--backend", "btrfs", "--btrfs-pool", filepath.Join(pool, "one"))
	os.WriteFile(filepath.Join(s.Root, "work"), []byte("turn 1\n"), 0o644)
	var c1 struct{ ID string }
	runJSON(t, h1, &c1, "checkpoint", "s")

	// A fresh home over a copy of h1's store: a new home id, and h1's pool
	// path still mounted on this host.
	os.MkdirAll(h2, 0o700)
	if out, err := exec.Command("cp", "-a", filepath.Join(h1, "store"), filepath.Join(h2, "store")).CombinedOutput(); err != nil {
		t.Fatalf("copy store: %v %s", err, out)
	}
	var rb struct{ Checkpoints, Sandboxes int }
	runJSON(t, h2, &rb, "catalog", "rebuild")
	if rb.Sandboxes != 1 {
		t.Fatalf("rebuild: %+v", rb)
	}
	out, code := run(t, h2, "branch", c1.ID, "copy")
	if code != exitUsage || !strings.Contains(out, "--btrfs-pool") {
		t.Fatalf("branch of another home's btrfs checkpoint without a pool: exit %d %s", code, out)
	}
	if _, err := os.Stat(filepath.Join(h2, "sandboxes", "copy")); !os.IsNotExist(err) {
		t.Fatal("the refused branch left a sandbox dir")
	}
	for _, args := range [][]string{{"checkpoint", "s"}, {"sandbox", "path", "s"}, {"rollback", "s", c1.ID}} {
		if out, code := run(t, h2, args...); code != exitPrecondition || !strings.Contains(out, "--catalog-only") {
			t.Fatalf("turnsnap %v on another home's btrfs sandbox: exit %d %s", args, code, out)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(pool, "one"))
	before := len(entries)

	var br struct{ Root string }
	runJSON(t, h2, &br, "branch", c1.ID, "mine", "--btrfs-pool", filepath.Join(pool, "two"))
	if b, err := os.ReadFile(filepath.Join(br.Root, "work")); err != nil || string(b) != "turn 1\n" {
		t.Fatalf("branch with a pool of this host: %q %v", b, err)
	}
	// Now h2 has a pool of its own: a branch without --btrfs-pool uses it.
	runJSON(t, h2, &br, "branch", c1.ID, "mine2")
	if !strings.HasPrefix(br.Root, h2) {
		t.Fatalf("second branch root %s", br.Root)
	}
	run(t, h2, "sandbox", "rm", "mine2")

	var rm struct{ Removed bool }
	runJSON(t, h2, &rm, "sandbox", "rm", "s", "--catalog-only")
	if !rm.Removed {
		t.Fatal("rm --catalog-only")
	}
	if entries, _ := os.ReadDir(filepath.Join(pool, "one")); len(entries) != before {
		t.Fatalf("h2 touched h1's pool: %d entries, had %d", len(entries), before)
	}
	if b, err := os.ReadFile(filepath.Join(s.Root, "work")); err != nil || string(b) != "turn 1\n" {
		t.Fatalf("h1's root after h2 forgot the sandbox: %q %v", b, err)
	}
	var c2 struct{ Class string }
	runJSON(t, h1, &c2, "checkpoint", "s")
}
