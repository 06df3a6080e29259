package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/proc"
)

// These tests need root, overlayfs, runc, busybox-static and the CRIU
// prefix that scripts/deps.d/30-proc.sh installs.

func requireProcs(t testing.TB) {
	t.Helper()
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("runc"); err != nil {
		testenv.Missing(t, "runc", "apt package runc")
	}
	if _, err := os.Stat(proc.DefaultCRIUPath()); err != nil {
		testenv.Missing(t, "CRIU", proc.DefaultCRIUPath()+" (scripts/criu-install.sh)")
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		testenv.Missing(t, "busybox", "apt package busybox-static")
	}
}

// busyboxBase is a minimal image a container can run: busybox and its
// applets, the directories a container mounts over, a web root.
func busyboxBase(t testing.TB) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp", "root", "www"} {
		must(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	must(t, os.Chmod(filepath.Join(root, "tmp"), 0o1777))
	bb, err := os.ReadFile("/bin/busybox")
	must(t, err)
	must(t, os.WriteFile(filepath.Join(root, "bin/busybox"), bb, 0o755))
	out, err := exec.Command("/bin/busybox", "--list").Output()
	must(t, err)
	for _, applet := range strings.Fields(string(out)) {
		if applet != "busybox" {
			must(t, os.Symlink("busybox", filepath.Join(root, "bin", applet)))
		}
	}
	must(t, os.WriteFile(filepath.Join(root, "www/index.html"), []byte("hello from turn 3\n"), 0o644))
	return root
}

func sh(t testing.TB, e *Engine, sandbox, script string) string {
	t.Helper()
	var out, errb bytes.Buffer
	code, err := e.Processes().Exec(context.Background(), delta.SandboxName(sandbox), []string{"sh", "-c", script}, ExecOptions{Stdout: &out, Stderr: &errb})
	if err != nil || code != 0 {
		t.Fatalf("exec %q in %s: code %d err %v stderr %s", script, sandbox, code, err, errb.String())
	}
	return strings.TrimSpace(out.String())
}

// counter reads the in-memory counter a process publishes through a file;
// the file is rewritten each tick, so a restarted process would show 1, 2.
func counter(t *testing.T, e *Engine, sandbox string) int {
	t.Helper()
	n, err := strconv.Atoi(sh(t, e, sandbox, "cat /tmp/count"))
	if err != nil {
		t.Fatalf("counter in %s: %v", sandbox, err)
	}
	return n
}

const counterScript = `n=0; while :; do n=$((n+1)); echo $n > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done`

func TestCounterContinuesAfterRollbackAndBranch(t *testing.T) {
	requireProcs(t)
	ctx := context.Background()
	e := newEngine(t)
	_, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: busyboxBase(t)})
	must(t, err)
	_, err = e.Processes().Exec(ctx, "s", []string{"sh", "-c", counterScript}, ExecOptions{Detach: true})
	must(t, err)
	waitCounter(t, e, "s", func(n int) bool { return n >= 20 })
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	if c1.Class != delta.ClassFull && c1.Class != delta.ClassProcess {
		t.Fatalf("turn that started a process classed %s", c1.Class)
	}
	// Read just after the cut: at least the cut's value (later on a loaded
	// machine). A process restarted from scratch would show single digits
	// where these checks expect at least half of it.
	atCut := counter(t, e, "s")
	if atCut < 20 {
		t.Fatalf("counter only at %d", atCut)
	}
	waitCounter(t, e, "s", func(n int) bool { return n > atCut+5 }) // it moved on past the cut
	_, err = e.Rollback(ctx, "s", mustRef(c1.ID.String()), RollbackOptions{})
	must(t, err)
	if n := counter(t, e, "s"); n < atCut/2 || n > atCut+40 {
		t.Fatalf("after rollback the counter is %d; at the cut it was about %d (a restarted process would be near 1)", n, atCut)
	}
	// Two branches of one checkpoint run side by side, each from the cut.
	for _, b := range []string{"b1", "b2"} {
		r, err := e.Branch(ctx, mustRef(c1.ID.String()), delta.SandboxName(b), BranchOptions{})
		must(t, err)
		if !r.Processes {
			t.Fatalf("branch %s did not restore processes", b)
		}
	}
	n1, n2, n0 := counter(t, e, "b1"), counter(t, e, "b2"), counter(t, e, "s")
	for name, n := range map[string]int{"b1": n1, "b2": n2} {
		if n < atCut/2 {
			t.Fatalf("branch %s counter %d restarted (cut at about %d)", name, n, atCut)
		}
	}
	// Each counter moves on by itself: they all run side by side.
	for name, from := range map[string]int{"b1": n1, "b2": n2, "s": n0} {
		waitCounter(t, e, name, func(n int) bool { return n > from })
	}
}

// waitCounter polls sandbox's counter until ok holds for it (a minute at
// most: a counter that never gets there has stopped) and returns it.
func waitCounter(t *testing.T, e *Engine, sandbox string, ok func(int) bool) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		n := counter(t, e, sandbox)
		if ok(n) {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("counter in %s stuck at %d", sandbox, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestHTTPServerFromTurn3AnswersAfterRestore(t *testing.T) {
	requireProcs(t)
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "web", CreateOptions{Base: busyboxBase(t)})
	must(t, err)
	sh(t, e, "web", "echo one > /tmp/turn1")
	c, err := e.Checkpoint(ctx, "web", CheckpointOptions{})
	must(t, err)
	if c.Class != delta.ClassFS {
		t.Fatalf("turn 1 (a command that exited) classed %s", c.Class)
	}
	write(t, filepath.Join(cr.Root, "turn2"), "two")
	_, err = e.Checkpoint(ctx, "web", CheckpointOptions{})
	must(t, err)
	_, err = e.Processes().Exec(ctx, "web", []string{"httpd", "-f", "-p", "8080", "-h", "/www"}, ExecOptions{Detach: true})
	must(t, err)
	time.Sleep(300 * time.Millisecond)
	c3, err := e.Checkpoint(ctx, "web", CheckpointOptions{})
	must(t, err)
	if c3.Class != delta.ClassProcess && c3.Class != delta.ClassFull {
		t.Fatalf("turn 3 started a server, classed %s", c3.Class)
	}
	sh(t, e, "web", "killall httpd; rm /turn2")
	c4, err := e.Checkpoint(ctx, "web", CheckpointOptions{})
	must(t, err)
	if c4.Class != delta.ClassFull {
		t.Fatalf("turn 4 stopped the server and deleted a file, classed %s", c4.Class)
	}
	_, err = e.Rollback(ctx, "web", mustRef(c3.ID.String()), RollbackOptions{})
	must(t, err)
	if got := sh(t, e, "web", "wget -q -O - http://127.0.0.1:8080/index.html"); got != "hello from turn 3" {
		t.Fatalf("server after restore answered %q", got)
	}
}

func TestCommandsThatExitAreNotProcessChanges(t *testing.T) {
	requireProcs(t)
	ctx := context.Background()
	e := newEngine(t)
	_, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: busyboxBase(t)})
	must(t, err)
	_, err = e.Processes().Exec(ctx, "s", []string{"sleep", "100000"}, ExecOptions{Detach: true})
	must(t, err)
	first, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	if first.Class != delta.ClassProcess && first.Class != delta.ClassFull {
		t.Fatalf("a new long-lived process classed %s", first.Class)
	}
	for _, cmd := range []string{"ls -la /bin >/dev/null", "cat /www/index.html", "ls /; cat /bin/busybox > /dev/null"} {
		sh(t, e, "s", cmd)
		r, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
		must(t, err)
		if r.Class != delta.ClassSkip && r.Class != delta.ClassFS {
			t.Fatalf("a turn that only ran %q classed %s", cmd, r.Class)
		}
	}
	// And an idle turn right after a process checkpoint is a skip.
	r, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	if r.Class != delta.ClassSkip {
		t.Fatalf("idle turn classed %s", r.Class)
	}
}

func TestRestoreRefusesAHostWithoutTheRecordedCPUFlags(t *testing.T) {
	requireProcs(t)
	ctx := context.Background()
	e := openEngineOracle(t, filepath.Join(t.TempDir(), "home"), false) // it forges a record in the catalog
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: busyboxBase(t)})
	must(t, err)
	_, err = e.Processes().Exec(ctx, "s", []string{"sleep", "100000"}, ExecOptions{Detach: true})
	must(t, err)
	write(t, filepath.Join(cr.Root, "data"), "x")
	c, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	orig, err := e.Resolve(ctx, mustRef(c.ID.String()))
	must(t, err)
	// The same checkpoint as if taken on a CPU with a flag this one lacks.
	var facts proc.HostFacts
	must(t, json.Unmarshal(orig.Host, &facts))
	facts.CPUFlags = append(facts.CPUFlags, "turnsnap_imaginary_flag")
	forged := *orig
	forged.Host, err = json.Marshal(facts)
	must(t, err)
	forged.ID = [32]byte{}
	forged.Message = "taken on another machine"
	must(t, putRecord(ctx, e.stores.front, &forged))
	must(t, e.cat.Update(ctx, func(tx *catalog.Tx) error { return tx.PutCheckpoint(&forged) }))

	_, err = e.Branch(ctx, mustRef(forged.ID.String()), "elsewhere", BranchOptions{})
	if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), "turnsnap_imaginary_flag") ||
		!strings.Contains(err.Error(), "--fs-only") {
		t.Fatalf("restore on a host without the flag: %v", err)
	}
	if _, err := os.Stat(e.home.sandboxDir("elsewhere")); !os.IsNotExist(err) {
		t.Fatal("a refused branch left a sandbox behind")
	}
	r, err := e.Branch(ctx, mustRef(forged.ID.String()), "elsewhere", BranchOptions{FSOnly: true})
	must(t, err)
	if r.Processes {
		t.Fatal("--fs-only restored processes")
	}
	if b, err := os.ReadFile(filepath.Join(r.Root, "data")); err != nil || string(b) != "x" {
		t.Fatalf("fs-only branch lacks the files: %q %v", b, err)
	}
}
