package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/internal/testhook"
)

// A `turnsnap rollback` SIGKILLed in the middle of rewriting the overlay
// layer (after the first of its changes, the root unmounted) is finished
// by the next command: the root is the checkpoint's state, its rewritten
// file kept its inode, and the head is the checkpoint (TURNSNAP_TEST_BLOCK_AT
// holds turnsnap at the phase; the test sends the SIGKILL).
func TestRollbackKilledMidRewrite(t *testing.T) {
	testenv.RequireRoot(t)
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	if err := os.WriteFile(filepath.Join(base, "base.txt"), []byte("base\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var created struct{ Root string }
	out, _ := mustCLI(t, home, "sandbox", "create", "r", "--base", base, "--json")
	if err := json.Unmarshal([]byte(out), &created); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cliRun(t, home, "sandbox", "rm", "r") })
	p := func(name string) string { return filepath.Join(created.Root, name) }
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(p(name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.txt", "turn 1\n")
	write("b.txt", "turn 1\n")
	time.Sleep(60 * time.Millisecond)
	var c1 struct{ ID string }
	out, _ = mustCLI(t, home, "checkpoint", "r", "--json")
	if err := json.Unmarshal([]byte(out), &c1); err != nil || c1.ID == "" {
		t.Fatalf("checkpoint --json: %q, %v", out, err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(p("a.txt"), &st); err != nil {
		t.Fatal(err)
	}
	ino := st.Ino
	write("a.txt", "turn 2 rewrote a\n") // in place: same inode
	write("b.txt", "turn 2 rewrote b\n")
	write("c.txt", "turn 2\n")
	time.Sleep(60 * time.Millisecond)
	mustCLI(t, home, "checkpoint", "r")

	flag := filepath.Join(t.TempDir(), "reached")
	cmd := cli(home, []string{testhook.BlockAtEnv + "=rollback: layer-rewrite:" + flag}, "rollback", "r", c1.ID)
	var cmdOut strings.Builder
	cmd.Stdout, cmd.Stderr = &cmdOut, &cmdOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(flag); err == nil {
			break
		}
		select {
		case <-exited:
			t.Fatalf("turnsnap rollback ended before the layer rewrite: %s", cmdOut.String())
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("turnsnap never reached the layer rewrite")
		}
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited

	// The next use of the sandbox finishes the rollback: a checkpoint then
	// finds nothing changed since the head, and the head is c1.
	var next struct{ ID, Class string }
	out, _ = mustCLI(t, home, "checkpoint", "r", "--json")
	if err := json.Unmarshal([]byte(out), &next); err != nil || next.ID != c1.ID || next.Class != "skip" {
		t.Fatalf("checkpoint after the killed rollback: %q (want a skip at %s), %v", out, c1.ID[:12], err)
	}
	for name, want := range map[string]string{"a.txt": "turn 1\n", "b.txt": "turn 1\n", "base.txt": "base\n"} {
		if got, err := os.ReadFile(p(name)); err != nil || string(got) != want {
			t.Fatalf("%s after the finished rollback: %q, %v", name, got, err)
		}
	}
	if _, err := os.Stat(p("c.txt")); !os.IsNotExist(err) {
		t.Fatalf("c.txt after the finished rollback: %v", err)
	}
	if err := syscall.Stat(p("a.txt"), &st); err != nil || st.Ino != ino {
		t.Fatalf("a.txt has inode %d after the finished rollback, had %d", st.Ino, ino)
	}
}
