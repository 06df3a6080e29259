package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/internal/testenv"
)

// TestCLIBranchFanOut: `branch CKPT NAME --count N` and `branch CKPT A B`
// make every sandbox (a JSON array), and bad fan-outs are usage errors.
func TestCLIBranchFanOut(t *testing.T) {
	testenv.RequireRoot(t)
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	os.WriteFile(filepath.Join(base, "a.txt"), []byte("base\n"), 0o644)
	names := []string{"s", "fan-1", "fan-2", "fan-3", "x", "y"}
	t.Cleanup(func() {
		for _, n := range names {
			run(t, home, "sandbox", "rm", n)
		}
	})
	var created struct{ Root string }
	runJSON(t, home, &created, "sandbox", "create", "s", "--base", base)
	os.WriteFile(filepath.Join(created.Root, "b.txt"), []byte("turn 1\n"), 0o644)
	var c1 struct{ ID string }
	runJSON(t, home, &c1, "checkpoint", "s")

	var fan []struct{ Sandbox, Root, Checkpoint string }
	runJSON(t, home, &fan, "branch", c1.ID, "fan", "--count", "3")
	if len(fan) != 3 || fan[0].Sandbox != "fan-1" || fan[2].Sandbox != "fan-3" || fan[1].Checkpoint != c1.ID {
		t.Fatalf("branch --count 3 --json: %+v", fan)
	}
	for _, b := range fan {
		if data, err := os.ReadFile(filepath.Join(b.Root, "b.txt")); err != nil || string(data) != "turn 1\n" {
			t.Fatalf("branch %s: b.txt %q %v", b.Sandbox, data, err)
		}
	}
	runJSON(t, home, &fan, "branch", c1.ID, "x", "y")
	if len(fan) != 2 || fan[1].Sandbox != "y" {
		t.Fatalf("branch CKPT x y --json: %+v", fan)
	}
	if out, code := run(t, home, "branch", c1.ID, "p", "q", "--count", "2"); code != exitUsage {
		t.Fatalf("--count with two names: exit %d: %s", code, out)
	}
	if out, code := run(t, home, "branch", c1.ID, "p", "--count", "-1"); code != exitUsage {
		t.Fatalf("--count -1: exit %d: %s", code, out)
	}
}
