package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/overlay"
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

// TestCheckpointKilledWhileFreezing: the checkpoint prints its result
// before its layer is frozen (in the background; the process exits once
// the freeze is done). A turnsnap killed (SIGKILL) once the layer is built
// but not published leaves the checkpoint whole and no layer: its branch
// materialises, and the next checkpoint sweeps the unpublished build and
// publishes its own layer, which the next branch stacks on.
func TestCheckpointKilledWhileFreezing(t *testing.T) {
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
	flag := filepath.Join(t.TempDir(), "reached")
	cmd := cli(home, []string{blockAtPhaseEnv + "=" + engine.PhaseFreezeLayer + ":" + flag}, "checkpoint", "s", "--json")
	stdout, err := os.Create(filepath.Join(t.TempDir(), "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	cmd.Stdout = stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var printed struct{ ID, Class string }
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		out, _ := os.ReadFile(stdout.Name())
		if _, err := os.Stat(flag); err == nil && json.Unmarshal(out, &printed) == nil {
			break // the result is out while the freeze is still blocked
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal("turnsnap never reached the freeze")
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	frozenDir := filepath.Join(home, "bases", ".frozen")
	if left, _ := filepath.Glob(filepath.Join(frozenDir, ".tmp-*")); len(left) != 1 {
		t.Fatalf("builds left by the kill: %v, want the one", left)
	}
	if layers, _ := filepath.Glob(filepath.Join(frozenDir, "[0-9a-f]*")); len(layers) != 0 {
		t.Fatalf("a killed freeze published %v", layers)
	}
	// The checkpoint committed before its layer was frozen: the next turn,
	// with nothing changed, is a skip naming it. (A writable command first:
	// Badger's read-only open refuses a log a kill left untruncated.)
	var c1 struct{ ID, Class string }
	out, _ = mustCLI(t, home, "checkpoint", "s", "--json")
	if err := json.Unmarshal([]byte(out), &c1); err != nil || c1.Class != "skip" {
		t.Fatalf("turn after the kill: %s %v", out, err)
	}
	var log []struct{ ID string }
	out, _ = mustCLI(t, home, "log", "s", "--json")
	if err := json.Unmarshal([]byte(out), &log); err != nil || len(log) != 2 || log[0].ID != c1.ID || printed.ID != c1.ID || printed.Class != "fs" {
		t.Fatalf("log after the kill: %s (%v): the checkpoint commits before its layer is frozen", out, err)
	}
	var br struct{ Root string }
	out, _ = mustCLI(t, home, "branch", log[0].ID, "b1", "--json")
	if err := json.Unmarshal([]byte(out), &br); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(br.Root, "turn1.txt")); err != nil || string(data) != "one\n" {
		t.Fatalf("branch of the checkpoint whose freeze was killed: %q %v", data, err)
	}
	if overlay.FrozenUser(filepath.Join(home, "sandboxes", "b1")) != "" {
		t.Fatal("branch stacked on a layer that was never published")
	}
	os.WriteFile(filepath.Join(created.Root, "turn2.txt"), []byte("two\n"), 0o644)
	out, _ = mustCLI(t, home, "checkpoint", "s", "--json")
	var c2 struct{ ID string }
	if err := json.Unmarshal([]byte(out), &c2); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(frozenDir, ".tmp-*")); len(left) != 0 {
		t.Fatalf("the next freeze left %v", left)
	}
	out, _ = mustCLI(t, home, "branch", c2.ID, "b2", "--json")
	if err := json.Unmarshal([]byte(out), &br); err != nil {
		t.Fatal(err)
	}
	if overlay.FrozenUser(filepath.Join(home, "sandboxes", "b2")) == "" {
		t.Fatal("branch of the next checkpoint does not stack")
	}
	if data, err := os.ReadFile(filepath.Join(br.Root, "turn2.txt")); err != nil || string(data) != "two\n" {
		t.Fatalf("stacked branch: %q %v", data, err)
	}
}
