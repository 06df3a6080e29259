package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	for _, a := range []string{"sh", "sleep", "echo"} {
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
	// The home is free while a command runs: another command does not wait.
	done := make(chan int)
	go func() {
		_, code := run(t, home, "exec", "s", "--", "sleep", "2")
		done <- code
	}()
	time.Sleep(700 * time.Millisecond)
	if out, code := run(t, home, "status"); code != 0 {
		t.Fatalf("status while exec runs (lock-wait 0): exit %d: %s", code, out)
	}
	if code := <-done; code != 0 {
		t.Fatalf("exec sleep 2: exit %d", code)
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
