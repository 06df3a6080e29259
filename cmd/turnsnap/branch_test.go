package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/internal/testhook"
	"github.com/turnsnap/turnsnap/overlay"
	frozenlayers "github.com/turnsnap/turnsnap/overlay/frozen"
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

// TestBranchKilledWhileFreezing: the CLI's checkpoint freezes no layer
// (its process would wait for it before exiting); the first branch of the
// checkpoint builds one and stacks on it. A turnsnap killed (SIGKILL) once
// that layer is built but not published leaves no layer and no branch; the
// next branch sweeps the unpublished build, builds the layer again and
// stacks on it, and a second branch stacks on the same layer; the
// sandbox's next checkpoint then keeps its layer too.
func TestBranchKilledWhileFreezing(t *testing.T) {
	testenv.RequireRoot(t)
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	os.WriteFile(filepath.Join(base, "a.txt"), []byte("base\n"), 0o644)
	names := []string{"s", "b1", "b2"}
	t.Cleanup(func() {
		for _, n := range names {
			cliRun(t, home, "sandbox", "rm", n)
		}
	})
	out, _ := mustCLI(t, home, "sandbox", "create", "s", "--base", base, "--json")
	var created struct{ Root string }
	if err := json.Unmarshal([]byte(out), &created); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(created.Root, "turn1.txt"), []byte("one\n"), 0o644)
	var c1 struct{ ID, Class string }
	out, _ = mustCLI(t, home, "checkpoint", "s", "--json")
	if err := json.Unmarshal([]byte(out), &c1); err != nil || c1.Class != "fs" {
		t.Fatalf("checkpoint: %s %v", out, err)
	}
	frozenDir := filepath.Join(home, "bases", ".frozen")
	layers := func() []string {
		m, _ := filepath.Glob(filepath.Join(frozenDir, "[0-9a-f]*"))
		return m
	}
	if l := layers(); len(l) != 0 {
		t.Fatalf("the CLI's checkpoint froze %v", l)
	}

	flag := filepath.Join(t.TempDir(), "reached")
	cmd := cli(home, []string{testhook.BlockAtEnv + "=" + frozenlayers.PhaseLayer + ":" + flag}, "branch", c1.ID, "b1", "--json")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(flag); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal("the branch never reached the freeze of its layer")
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	if left, _ := filepath.Glob(filepath.Join(frozenDir, ".tmp-*")); len(left) != 1 {
		t.Fatalf("builds left by the kill: %v, want the one", left)
	}
	if l := layers(); len(l) != 0 {
		t.Fatalf("a killed freeze published %v", l)
	}
	// (A writable command first: Badger's read-only open refuses a log a
	// kill left untruncated.)
	if out, errs, code := cliRun(t, home, "checkpoint", "s", "--json"); code != 0 || !strings.Contains(out, `"skip"`) {
		t.Fatalf("turn after the kill: exit %d: %s %s", code, out, errs)
	}
	if out, _ := mustCLI(t, home, "sandbox", "list", "--json"); strings.Contains(out, `"b1"`) {
		t.Fatalf("the killed branch left its sandbox: %s", out)
	}

	var br struct{ Root string }
	for _, name := range []string{"b1", "b2"} {
		out, _ = mustCLI(t, home, "branch", c1.ID, name, "--json")
		if err := json.Unmarshal([]byte(out), &br); err != nil {
			t.Fatal(err)
		}
		if data, err := os.ReadFile(filepath.Join(br.Root, "turn1.txt")); err != nil || string(data) != "one\n" {
			t.Fatalf("branch %s: %q %v", name, data, err)
		}
		l := layers()
		if len(l) != 1 || overlay.FrozenUser(filepath.Join(home, "sandboxes", name)) != l[0] {
			t.Fatalf("branch %s stacks on %q; layers %v", name, overlay.FrozenUser(filepath.Join(home, "sandboxes", name)), l)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(frozenDir, ".tmp-*")); len(left) != 0 {
		t.Fatalf("the next freeze left %v", left)
	}
	// Branched once, the sandbox keeps its next checkpoint's layer (made
	// from the first: the cost of the turn's changes).
	os.WriteFile(filepath.Join(created.Root, "turn2.txt"), []byte("two\n"), 0o644)
	mustCLI(t, home, "checkpoint", "s", "--json")
	if l := layers(); len(l) != 2 {
		t.Fatalf("layers after the next checkpoint: %v, want two", l)
	}
	var v struct {
		FrozenChecked bool `json:"frozen_checked"`
	}
	out, _ = mustCLI(t, home, "verify", c1.ID, "--json")
	if err := json.Unmarshal([]byte(out), &v); err != nil || !v.FrozenChecked {
		t.Fatalf("verify of the branched checkpoint did not check its layer: %s %v", out, err)
	}
}
