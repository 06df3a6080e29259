package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/proc"
)

// `turnsnap exec` streams the command's output and exits with its status;
// --detach starts a long-lived process the next checkpoint classes as such.
func TestCLIExec(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("runc"); err != nil {
		testenv.Missing(t, "runc", "apt package runc")
	}
	if _, err := os.Stat(proc.DefaultCRIUPath()); err != nil {
		testenv.Missing(t, "CRIU", proc.DefaultCRIUPath())
	}
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp"} {
		os.MkdirAll(filepath.Join(base, d), 0o755)
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		testenv.Missing(t, "busybox", "apt package busybox-static")
	}
	os.WriteFile(filepath.Join(base, "bin/busybox"), bb, 0o755)
	for _, a := range []string{"sh", "sleep", "echo", "env"} {
		os.Symlink("busybox", filepath.Join(base, "bin", a))
	}
	t.Cleanup(func() { run(t, home, "sandbox", "rm", "s") })
	if out, code := run(t, home, "sandbox", "create", "s", "--base", base); code != 0 {
		t.Fatalf("create: %s", out)
	}
	// exec writes to the process's real stdout; capture it through a pipe.
	r, w, _ := os.Pipe()
	stdout := os.Stdout
	os.Stdout = w
	_, code := run(t, home, "exec", "s", "--", "sh", "-c", "echo inside; exit 3")
	w.Close()
	os.Stdout = stdout
	got, _ := io.ReadAll(r)
	if code != 3 || strings.TrimSpace(string(got)) != "inside" {
		t.Fatalf("exec: exit %d, output %q; want 3 and %q", code, got, "inside")
	}
	// --agent: the agent's own files go to its tmpfs, not the root.
	r, w, _ = os.Pipe()
	os.Stdout = w
	_, code = run(t, home, "exec", "s", "--agent", "--", "env", "OPENAI_BASE_URL=mine", "sh", "-c", `echo "$TURNSNAP_AGENT $HOME $TMPDIR $CLAUDE_CONFIG_DIR $ANTHROPIC_BASE_URL $OPENAI_BASE_URL"`)
	w.Close()
	os.Stdout = stdout
	got, _ = io.ReadAll(r)
	d := proc.AgentStateDir
	if want := "1 " + d + " " + d + " " + d + "/.claude http://" + proc.AgentLLMAddr + "/llm/s mine"; code != 0 || strings.TrimSpace(string(got)) != want {
		t.Fatalf("exec --agent: exit %d, output %q; want %q", code, got, want)
	}
	if out, code := run(t, home, "exec", "s", "--agent", "--detach", "--", "sleep", "1"); code == 0 || !strings.Contains(out, "--detach") {
		t.Fatalf("exec --agent --detach: exit %d: %s; want a refusal", code, out)
	}
	// The home is free while a command runs: another command does not wait.
	// The exec's shell is found running (by its marker argument) before
	// status runs, and ends when the test signals it, so status provably
	// ran while the exec held the sandbox. Nothing is written to the root.
	const marker = "turnsnap-exec-test-waiter"
	done := make(chan int)
	go func() {
		_, code := run(t, home, "exec", "s", "--", "sh", "-c",
			"trap 'exit 0' USR1; i=0; while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; exit 9", marker)
		done <- code
	}()
	var pid int
	// Found and catching USR1: as the container's init, a shell that has
	// not yet run its trap would ignore the signal.
	waitFor(t, "the exec's shell to trap USR1", func() bool {
		pid = findProcess(marker)
		return pid > 0 && catches(pid, syscall.SIGUSR1)
	})
	if out, code := run(t, home, "status"); code != 0 {
		t.Fatalf("status while exec runs (lock-wait 0): exit %d: %s", code, out)
	}
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if code := <-done; code != 0 {
		t.Fatalf("exec of the waiting shell: exit %d (9: it was never signalled)", code)
	}
	if out, code := run(t, home, "exec", "s", "--detach", "--", "sleep", "1000"); code != 0 {
		t.Fatalf("exec --detach: %d %s", code, out)
	}
	var ck struct{ Class string }
	runJSON(t, home, &ck, "checkpoint", "s")
	if ck.Class != "process" {
		t.Fatalf("turn that started a long-lived process classed %q", ck.Class)
	}
}

// waitFor polls cond until it holds (a condition the test watches, not a
// guess at how long something takes); a minute without it fails the test.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// findProcess returns the pid of the shell whose command line holds arg as
// a whole argument (not runc's, which names the same arguments), 0 when
// there is none.
func findProcess(arg string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(string(b), "\x00")
		if err == nil && (args[0] == "sh" || strings.HasSuffix(args[0], "/sh")) && slices.Contains(args, arg) {
			return pid
		}
	}
	return 0
}

// catches reports whether process pid has a handler for sig (SigCgt).
func catches(pid int, sig syscall.Signal) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "SigCgt:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<(uint(sig)-1)) != 0
		}
	}
	return false
}
