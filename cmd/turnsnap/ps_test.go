package main

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/proc"
)

// captureStd runs fn with the process's stdout and stderr going to pipes
// and returns what was written to them.
func captureStd(t *testing.T, fn func()) string {
	t.Helper()
	r, w, _ := os.Pipe()
	so, se := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = w, w
	fn()
	w.Close()
	os.Stdout, os.Stderr = so, se
	b, _ := io.ReadAll(r)
	return string(b)
}

// exec --detach prints the pid and logs to a file in the sandbox; ps lists
// the process and whether the head holds it; a missing command exits 127
// and an unexecutable one 126, each with one message.
func TestCLIExecDetachPs(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("runc"); err != nil {
		testenv.Missing(t, "runc", "apt package runc")
	}
	if _, err := os.Stat(proc.DefaultCRIUPath()); err != nil {
		testenv.Missing(t, "CRIU", proc.DefaultCRIUPath())
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		testenv.Missing(t, "busybox", "apt package busybox-static")
	}
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp", "var/log"} {
		os.MkdirAll(filepath.Join(base, d), 0o755)
	}
	os.WriteFile(filepath.Join(base, "bin/busybox"), bb, 0o755)
	for _, a := range []string{"sh", "sleep", "echo", "cat", "true"} {
		os.Symlink("busybox", filepath.Join(base, "bin", a))
	}
	os.WriteFile(filepath.Join(base, "bin/script"), []byte("#!/bin/sh\necho hi\n"), 0o644) // not executable
	t.Cleanup(func() { run(t, home, "sandbox", "rm", "s") })
	if out, code := run(t, home, "sandbox", "create", "s", "--base", base); code != 0 {
		t.Fatalf("create: %s", out)
	}
	for _, tc := range []struct {
		argv []string
		code int
		msg  string
	}{
		{[]string{"nosuch"}, 127, "nosuch: command not found"},
		{[]string{"/bin/nosuch"}, 127, "/bin/nosuch: no such file"},
		{[]string{"/bin/script"}, 126, "/bin/script: permission denied"},
		{[]string{"/tmp"}, 126, "/tmp: is a directory"},
		{[]string{"--detach", "nosuch"}, 127, "nosuch: command not found"},
	} {
		var out string
		var code int
		std := captureStd(t, func() {
			args := append([]string{"exec", "s"}, tc.argv[:len(tc.argv)-1]...)
			out, code = run(t, home, append(args, "--", tc.argv[len(tc.argv)-1])...)
		})
		name := tc.argv[len(tc.argv)-1]
		if code != tc.code || !strings.Contains(out, tc.msg) || strings.Count(out+std, name) != 1 {
			t.Errorf("exec %v: exit %d, want %d; message %q, process output %q: want %q once", tc.argv, code, tc.code, out, std, tc.msg)
		}
	}

	var started struct {
		PID int
		Log string
	}
	out, code := run(t, home, "--json", "exec", "s", "--detach", "--log", "/var/log/srv.log", "--", "sh", "-c", "echo serving; exec sleep 100000")
	if err := json.Unmarshal([]byte(out), &started); code != 0 || err != nil {
		t.Fatalf("exec --detach --json: exit %d %q %v", code, out, err)
	}
	if started.PID <= 1 || started.Log != "/var/log/srv.log" {
		t.Fatalf("exec --detach --json: %+v", started)
	}
	text, code := run(t, home, "exec", "s", "--detach", "--", "sleep", "100001")
	if code != 0 || strings.TrimSpace(text) == "" || strings.Trim(strings.TrimSpace(text), "0123456789") != "" {
		t.Fatalf("exec --detach prints the pid: %q exit %d", text, code)
	}
	for _, bad := range [][]string{
		{"--detach", "--log", "var/log/x", "--", "sleep", "1"},
		{"--detach", "--log", "/nodir/x.log", "--", "sleep", "1"},
		{"--log", "/var/log/x", "--", "true"},
	} {
		out, code := run(t, home, append([]string{"exec", "s"}, bad...)...)
		if code != exitUsage || strings.Count(out, bad[len(bad)-4]) > 1 {
			t.Errorf("exec %v: exit %d, want %d, naming %s at most once: %s", bad, code, exitUsage, bad[len(bad)-4], out)
		}
	}
	type psJSON struct {
		Running   bool
		Processes []struct {
			PID          int
			Command      []string
			Started      string
			InCheckpoint bool `json:"in_checkpoint"`
		}
	}
	var ps psJSON
	runJSON(t, home, &ps, "ps", "s")
	if !ps.Running || len(ps.Processes) != 2 || ps.Processes[0].PID != started.PID || ps.Processes[0].InCheckpoint ||
		ps.Processes[0].Started == "" || strings.Join(ps.Processes[0].Command, " ") != "sleep 100000" {
		t.Fatalf("ps before a checkpoint: %+v", ps)
	}
	var ck struct{ Class string }
	runJSON(t, home, &ck, "checkpoint", "s")
	if ck.Class != "full" { // the processes, and the log they wrote
		t.Fatalf("checkpoint class %q", ck.Class)
	}
	if out, code := run(t, home, "exec", "s", "--detach", "--", "sleep", "100002"); code != 0 {
		t.Fatalf("exec --detach: %s", out)
	}
	runJSON(t, home, &ps, "ps", "s")
	if len(ps.Processes) != 3 || !ps.Processes[0].InCheckpoint || !ps.Processes[1].InCheckpoint || ps.Processes[2].InCheckpoint {
		t.Fatalf("ps after a checkpoint and one more process: %+v", ps)
	}
	if text, code := run(t, home, "ps", "s"); code != 0 || !strings.Contains(text, "IN CHECKPOINT") || !strings.Contains(text, "sleep 100002") {
		t.Fatalf("ps text: %s", text)
	}
	logged := captureStd(t, func() { run(t, home, "exec", "s", "--", "cat", "/var/log/srv.log") })
	if strings.TrimSpace(logged) != "serving" {
		t.Fatalf("the detached process's log holds %q", logged)
	}
}
