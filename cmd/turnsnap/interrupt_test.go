package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/internal/testhook"
)

// Interrupted operations (issue 24): whatever a SIGKILLed turnsnap left is
// finished right or abandoned on purpose, never inherited, and never
// blocks a command that only reads.

// killAt runs `turnsnap args...` held at phase (TURNSNAP_TEST_BLOCK_AT),
// waits until it is there and SIGKILLs it.
func killAt(t *testing.T, home, phase string, args ...string) {
	t.Helper()
	flag := filepath.Join(t.TempDir(), "reached")
	cmd := cli(home, []string{testhook.BlockAtEnv + "=" + phase + ":" + flag}, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	waitFlag(t, flag, exited, func() string { return "turnsnap " + strings.Join(args, " ") + ": " + out.String() })
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// waitFlag waits for a TURNSNAP_TEST_BLOCK_AT flag file; exited closing
// first (the process ended without reaching the phase) fails the test.
func waitFlag(t *testing.T, flag string, exited <-chan struct{}, what func() string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(flag); err == nil {
			return
		}
		select {
		case <-exited:
			t.Fatalf("ended before reaching the phase: %s", what())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("never reached the phase: %s", what())
		}
	}
}

// rollbackScene makes sandbox r (base.txt from its base) with two
// checkpoints: c1 (a.txt, b.txt "turn 1") and c2 (both rewritten, c.txt
// added). A rollback from c2 to c1 rewrites three names, so one killed
// after its first change is partway.
func rollbackScene(t *testing.T, home string) (root, c1, c2 string) {
	t.Helper()
	testenv.RequireRoot(t)
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
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(created.Root, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	checkpoint := func() string {
		t.Helper()
		time.Sleep(60 * time.Millisecond) // past the mtime granularity: the scan reads the files
		var c struct{ ID string }
		out, _ := mustCLI(t, home, "checkpoint", "r", "--json")
		if err := json.Unmarshal([]byte(out), &c); err != nil || c.ID == "" {
			t.Fatalf("checkpoint --json: %q, %v", out, err)
		}
		return c.ID
	}
	write("a.txt", "turn 1\n")
	write("b.txt", "turn 1\n")
	c1 = checkpoint()
	write("a.txt", "turn 2\n")
	write("b.txt", "turn 2\n")
	write("c.txt", "turn 2\n")
	c2 = checkpoint()
	return created.Root, c1, c2
}

// headOf checkpoints sandbox name (a skip when nothing changed) and
// returns the checkpoint's id and class.
func headOf(t *testing.T, home, name string) (id, class string) {
	t.Helper()
	var c struct{ ID, Class string }
	out, _ := mustCLI(t, home, "checkpoint", name, "--json")
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		t.Fatalf("checkpoint --json: %q, %v", out, err)
	}
	return c.ID, c.Class
}

func contentOf(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if os.IsNotExist(err) {
		return "<absent>"
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A rollback killed midway, then `sandbox rm`: the rollback dies with its
// sandbox. A new sandbox of the same name on another base is its own: its
// first command does not "roll it back" to the removed one's checkpoint.
func TestInterruptedRollbackDiesWithSandbox(t *testing.T) {
	home := filepath.Join(t.TempDir(), "home")
	_, c1, _ := rollbackScene(t, home)
	killAt(t, home, "rollback: layer-rewrite", "rollback", "r", c1)
	mustCLI(t, home, "sandbox", "rm", "r")

	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "other.txt"), []byte("other base\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var created struct{ Root, Checkpoint string }
	out, _ := mustCLI(t, home, "sandbox", "create", "r", "--base", other, "--json")
	if err := json.Unmarshal([]byte(out), &created); err != nil || created.Checkpoint == "" {
		t.Fatalf("sandbox create --json: %q, %v", out, err)
	}
	id, class := headOf(t, home, "r")
	if id != created.Checkpoint || class != "skip" {
		t.Fatalf("the new sandbox's first checkpoint is %s %s, want a skip at its turn 0 %s (the removed sandbox's rollback to %s was applied to it?)",
			class, id, created.Checkpoint, c1)
	}
	for name, want := range map[string]string{"other.txt": "other base\n", "a.txt": "<absent>", "base.txt": "<absent>"} {
		if got := contentOf(t, filepath.Join(created.Root, name)); got != want {
			t.Fatalf("new sandbox r: %s is %q, want %q", name, got, want)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(home, "intents")); len(ents) > 0 {
		t.Fatalf("intents left after the removal and a new sandbox's turn: %v", ents)
	}
}

// Commands that only read work on a sandbox whose rollback was killed, say
// so, and finish nothing: ps, diff and status in direct mode (the home is
// opened read-only), again and again, until a command that writes
// finishes the rollback.
func TestReadOnlyCommandsShowInterruptedRollback(t *testing.T) {
	home := filepath.Join(t.TempDir(), "home")
	_, c1, c2 := rollbackScene(t, home)
	killAt(t, home, "rollback: layer-rewrite", "rollback", "r", c1)

	for round := range 2 { // a second round: the first finished nothing
		out, errs, code := cliRun(t, home, "ps", "r")
		if code != 0 || !strings.Contains(out, "interrupted rollback to "+c1[:12]) {
			t.Fatalf("round %d: ps: exit %d, %q %q", round, code, out, errs)
		}
		var ps struct{ Interrupted struct{ Rollback string } }
		out, errs, code = cliRun(t, home, "ps", "r", "--json")
		if code != 0 || json.Unmarshal([]byte(out), &ps) != nil || ps.Interrupted.Rollback != c1 {
			t.Fatalf("round %d: ps --json: exit %d, %q %q", round, code, out, errs)
		}
		out, errs, code = cliRun(t, home, "diff", "r")
		if code != 0 || !strings.Contains(errs, "interrupted rollback to "+c1[:12]) {
			t.Fatalf("round %d: diff: exit %d, %q %q", round, code, out, errs)
		}
		var d struct{ Interrupted struct{ Rollback string } }
		out, errs, code = cliRun(t, home, "diff", "r", c1, c2, "--json")
		if code != 0 || json.Unmarshal([]byte(out), &d) != nil || d.Interrupted.Rollback != c1 {
			t.Fatalf("round %d: diff of checkpoints --json: exit %d, %q %q", round, code, out, errs)
		}
		var st struct {
			Sandboxes []struct {
				Sandbox     string
				Interrupted struct{ Rollback string }
			}
		}
		out, errs, code = cliRun(t, home, "status", "--json")
		if code != 0 || json.Unmarshal([]byte(out), &st) != nil || len(st.Sandboxes) != 1 || st.Sandboxes[0].Interrupted.Rollback != c1 {
			t.Fatalf("round %d: status --json: exit %d, %q %q", round, code, out, errs)
		}
	}
	// The first command that writes finishes it: the head is c1.
	if id, class := headOf(t, home, "r"); id != c1 || class != "skip" {
		t.Fatalf("checkpoint after the killed rollback: %s %s, want a skip at %s", class, id, c1)
	}
	out, _ := mustCLI(t, home, "ps", "r", "--json")
	if strings.Contains(out, "interrupted") {
		t.Fatalf("ps after the rollback was finished: %s", out)
	}
}

// `rollback --abandon` discards a killed rollback without finishing it:
// the root is the head's state again, the head did not move.
func TestAbandonInterruptedRollback(t *testing.T) {
	home := filepath.Join(t.TempDir(), "home")
	root, c1, c2 := rollbackScene(t, home)
	killAt(t, home, "rollback: layer-rewrite", "rollback", "r", c1)

	out, errs := mustCLI(t, home, "rollback", "r", "--abandon")
	if !strings.Contains(out, "abandoned") || !strings.Contains(out, c2[:12]) {
		t.Fatalf("rollback --abandon: %q %q", out, errs)
	}
	for name, want := range map[string]string{"a.txt": "turn 2\n", "b.txt": "turn 2\n", "c.txt": "turn 2\n", "base.txt": "base\n"} {
		if got := contentOf(t, filepath.Join(root, name)); got != want {
			t.Fatalf("after abandoning: %s is %q, want %q", name, got, want)
		}
	}
	if id, class := headOf(t, home, "r"); id != c2 || class != "skip" {
		t.Fatalf("checkpoint after abandoning: %s %s, want a skip at %s", class, id, c2)
	}
	if _, errs, code := cliRun(t, home, "rollback", "r", "--abandon"); code == 0 || !strings.Contains(errs, "no interrupted rollback") {
		t.Fatalf("a second --abandon: exit %d, %q", code, errs)
	}
}

// A daemon started on a home with a killed rollback serves the other
// sandboxes while it repairs that one: the repair is held (the test hook
// blocks it inside the layer rewrite), and a checkpoint of another
// sandbox through the daemon succeeds meanwhile.
func TestDaemonServesOthersWhileRecovering(t *testing.T) {
	home := filepath.Join(t.TempDir(), "home")
	_, c1, _ := rollbackScene(t, home)
	other := t.TempDir()
	var created struct{ Root string }
	out, _ := mustCLI(t, home, "sandbox", "create", "o", "--base", other, "--json")
	if err := json.Unmarshal([]byte(out), &created); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cliRun(t, home, "sandbox", "rm", "o") })
	killAt(t, home, "rollback: layer-rewrite", "rollback", "r", c1)

	flag := filepath.Join(t.TempDir(), "reached")
	d := startDaemon(t, home, []string{testhook.BlockAtEnv + "=rollback: layer-rewrite:" + flag})
	waitFlag(t, flag, d.exited, d.stderr.String) // r's repair is under way, and held
	if err := os.WriteFile(filepath.Join(created.Root, "new.txt"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var c struct{ Class string }
	out, errs := mustCLI(t, home, "checkpoint", "o", "--json")
	if err := json.Unmarshal([]byte(out), &c); err != nil || c.Class != "fs" {
		t.Fatalf("checkpoint of another sandbox during the repair: %q %q, %v", out, errs, err)
	}
	d.cmd.Process.Signal(syscall.SIGKILL) // held for ever by the hook
	<-d.exited
	if id, class := headOf(t, home, "r"); id != c1 || class != "skip" {
		t.Fatalf("checkpoint after the killed repair: %s %s, want a skip at %s", class, id, c1)
	}
}

// A branch killed after it made the new root, before the catalog knew the
// sandbox, leaves a root that the next branch of that name, and `sandbox
// rm`, recognise and remove.
func TestKilledBranchLeftovers(t *testing.T) {
	testenv.RequireRoot(t)
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	var created struct{ Root string }
	out, _ := mustCLI(t, home, "sandbox", "create", "s", "--base", base, "--json")
	if err := json.Unmarshal([]byte(out), &created); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(created.Root, "f.txt"), []byte("turn 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	id, _ := headOf(t, home, "s")
	t.Cleanup(func() {
		for _, n := range []string{"s", "b", "b2"} {
			cliRun(t, home, "sandbox", "rm", n)
		}
	})
	for _, name := range []string{"b", "b2"} {
		killAt(t, home, "branch: roots made", "branch", id, name)
		if _, err := os.Stat(filepath.Join(home, "sandboxes", name)); err != nil {
			t.Fatalf("the killed branch left no root: the test proves nothing: %v", err)
		}
	}
	// The next branch of the name removes the leftover and branches.
	var br struct{ Root string }
	out, _ = mustCLI(t, home, "branch", id, "b", "--json")
	if err := json.Unmarshal([]byte(out), &br); err != nil {
		t.Fatalf("branch --json: %q", out)
	}
	if got := contentOf(t, filepath.Join(br.Root, "f.txt")); got != "turn 1\n" {
		t.Fatalf("branch over a leftover: f.txt is %q", got)
	}
	// `sandbox rm` removes one.
	mustCLI(t, home, "sandbox", "rm", "b2")
	if _, err := os.Stat(filepath.Join(home, "sandboxes", "b2")); !os.IsNotExist(err) {
		t.Fatalf("sandbox rm left the leftover root: %v", err)
	}
	mustCLI(t, home, "sandbox", "create", "b2", "--base", base)
	if _, errs, code := cliRun(t, home, "sandbox", "rm", "nothing-here"); code == 0 {
		t.Fatalf("sandbox rm of a name nothing knows succeeded: %q", errs)
	}
}

// procWith returns the pid of a process whose command line holds every
// one of parts, or 0.
func procWith(parts ...string) int {
	ents, _ := os.ReadDir("/proc")
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cmdline := strings.ReplaceAll(string(b), "\x00", " ")
		all := true
		for _, p := range parts {
			all = all && strings.Contains(cmdline, p)
		}
		if all {
			return pid
		}
	}
	return 0
}

// A `turnsnap checkpoint` SIGKILLed early (direct mode, a long-lived
// process in the sandbox), at fixed delays after it starts and at the
// moment its `runc checkpoint` runs: the next `turnsnap exec NAME -- true`
// returns (bounded here by a minute), and the process runs on.
func TestExecAfterCheckpointKilledEarly(t *testing.T) {
	testenv.RequireRoot(t)
	home := filepath.Join(t.TempDir(), "home")
	base := busyboxBase(t, "true")
	mustCLI(t, home, "sandbox", "create", "k", "--base", base)
	t.Cleanup(func() { cliRun(t, home, "sandbox", "rm", "k") })
	mustCLI(t, home, "exec", "--detach", "k", "--", "sh", "-c",
		`n=0; while :; do n=$((n+1)); echo $n > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done`)
	mustCLI(t, home, "checkpoint", "k")

	type kill struct {
		name string
		when func(cmd *exec.Cmd) // returns once turnsnap may be killed
	}
	var kills []kill
	for _, ms := range []int{10, 30, 50, 70, 90} {
		kills = append(kills, kill{fmt.Sprintf("after %d ms", ms), func(*exec.Cmd) { time.Sleep(time.Duration(ms) * time.Millisecond) }})
	}
	// CRIU thaws and freezes the container again while it dumps: the
	// kill lands at several points of that.
	for _, ms := range []int{0, 20, 40, 60, 0, 20, 40, 60} {
		kills = append(kills, kill{fmt.Sprintf("%d ms into runc checkpoint", ms), func(*exec.Cmd) {
			for deadline := time.Now().Add(time.Minute); procWith("runc", " checkpoint ", filepath.Join(home, "proc", "work")) == 0; {
				if time.Now().After(deadline) {
					t.Fatal("turnsnap checkpoint never ran runc checkpoint")
				}
				time.Sleep(time.Millisecond)
			}
			time.Sleep(time.Duration(ms) * time.Millisecond)
		}})
	}
	for _, k := range kills {
		cmd := cli(home, nil, "checkpoint", "k")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		k.when(cmd)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()

		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		ex := exec.CommandContext(ctx, os.Args[0], "--home", home, "exec", "k", "--", "true")
		ex.Env = append(os.Environ(), runMainEnv+"=1")
		out, err := ex.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("killed %s: turnsnap exec k -- true: %v (a minute is the bound): %s", k.name, err, out)
		}
		n := counterValue(t, home, "k")
		for deadline := time.Now().Add(30 * time.Second); counterValue(t, home, "k") <= n; {
			if time.Now().After(deadline) {
				t.Fatalf("killed %s: the sandbox's process does not run (frozen: %v)", k.name, frozen(t, home, "k"))
			}
		}
	}
	if frozen(t, home, "k") {
		t.Fatal("the container is frozen at the end")
	}
}

// A rollback to a checkpoint with a long-lived process, SIGKILLed after
// root and head were switched but before the process was restored: the
// next command (direct), or a daemon started on the home, finishes the
// rollback with its process running; `rollback --abandon` instead leaves
// the sandbox visibly without its processes until the next rollback.
func TestKilledRollbackRestoresProcesses(t *testing.T) {
	for _, mode := range []string{"direct", "daemon", "abandon"} {
		t.Run(mode, func(t *testing.T) {
			testenv.RequireRoot(t)
			home := filepath.Join(t.TempDir(), "home")
			base := busyboxBase(t, "true")
			var created struct{ Root string }
			out, _ := mustCLI(t, home, "sandbox", "create", "k", "--base", base, "--json")
			if err := json.Unmarshal([]byte(out), &created); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cliRun(t, home, "sandbox", "rm", "k") })
			mustCLI(t, home, "exec", "--detach", "k", "--", "sh", "-c",
				`n=0; while :; do n=$((n+1)); echo $n > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done`)
			c1, _ := headOf(t, home, "k")
			if err := os.WriteFile(filepath.Join(created.Root, "later.txt"), []byte("x\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			c2, _ := headOf(t, home, "k")
			killAt(t, home, "rollback: head moved", "rollback", "k", c1)

			var ps struct {
				Running     bool
				Processes   []struct{ Command []string }
				Interrupted struct {
					Rollback      string
					ProcessesLost string `json:"processes_lost"`
				}
			}
			out, errs, code := cliRun(t, home, "ps", "k", "--json")
			if code != 0 || json.Unmarshal([]byte(out), &ps) != nil || ps.Interrupted.Rollback != c1 || ps.Running {
				t.Fatalf("ps after the kill: exit %d, %q %q", code, out, errs)
			}
			daemonLog := func() string { return "" }
			switch mode {
			case "daemon":
				d := startDaemon(t, home, nil)
				daemonLog = d.stderr.String
			case "abandon":
				mustCLI(t, home, "rollback", "k", "--abandon")
				out, _ := mustCLI(t, home, "ps", "k")
				if !strings.Contains(out, "processes not restored") {
					t.Fatalf("ps after abandoning: %q", out)
				}
				out, _ = mustCLI(t, home, "status")
				if !strings.Contains(out, "processes not restored") {
					t.Fatalf("status after abandoning: %q", out)
				}
				_, errs := mustCLI(t, home, "exec", "k", "--", "true")
				if !strings.Contains(errs, "not restored") {
					t.Fatalf("exec after abandoning does not say the processes were not restored: %q", errs)
				}
				if id, _ := headOf(t, home, "k"); id == c1 {
					t.Fatalf("the abandoned rollback moved the head to %s", c1)
				}
				_ = c2
				mustCLI(t, home, "rollback", "k", c1) // the way back to running processes
			}
			// The next command that uses the sandbox (an exec, through the
			// daemon when one runs) finds the process running again.
			n := counterValue(t, home, "k")
			for deadline := time.Now().Add(30 * time.Second); counterValue(t, home, "k") <= n; {
				if time.Now().After(deadline) {
					t.Fatalf("the checkpoint's process does not run after the killed rollback\n%s", daemonLog())
				}
			}
			out, errs, code = cliRun(t, home, "ps", "k", "--json")
			ps.Interrupted.Rollback, ps.Interrupted.ProcessesLost = "", ""
			if code != 0 || json.Unmarshal([]byte(out), &ps) != nil || !ps.Running || len(ps.Processes) == 0 ||
				ps.Interrupted.Rollback != "" || ps.Interrupted.ProcessesLost != "" {
				t.Fatalf("ps after the finished rollback: exit %d, %q %q", code, out, errs)
			}
			if _, err := os.Stat(filepath.Join(created.Root, "later.txt")); !os.IsNotExist(err) {
				t.Fatalf("later.txt after the rollback to %s: %v", c1, err)
			}
		})
	}
}

// A removal commits the catalog before it touches the disk: killed between
// the two, the sandbox is gone from the catalog and its root is a leftover
// that `sandbox rm` of the name removes, after which the name is free.
func TestRemoveKilledAfterCatalog(t *testing.T) {
	home := t.TempDir()
	root, _, _ := rollbackScene(t, home)
	killAt(t, home, engine.PhaseRemoveCommitted, "sandbox", "rm", "r")
	out, _ := mustCLI(t, home, "sandbox", "ls", "--json")
	if strings.Contains(out, `"r"`) {
		t.Fatalf("sandbox r still listed after its removal committed: %s", out)
	}
	if _, err := os.Stat(filepath.Join(root, "a.txt")); err != nil {
		t.Fatalf("the kill came before the root's removal, so the root must still be there: %v", err)
	}
	mustCLI(t, home, "sandbox", "rm", "r")
	if _, err := os.Lstat(root); !os.IsNotExist(err) {
		t.Fatalf("sandbox rm of the leftover left its root %s: %v", root, err)
	}
	base := t.TempDir()
	mustCLI(t, home, "sandbox", "create", "r", "--base", base)
}
