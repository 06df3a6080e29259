package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/internal/testhook"
)

func waitFile(t *testing.T, path string, what string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Exec through the daemon: stdin streamed in, stdout and stderr streamed
// out, the exit status; a detached process's pid and log; SSE output.
// Then SIGTERM while a commit is held: the commit finishes, the daemon
// exits 0 and the sandbox's process keeps running.
func TestServeExecAndSIGTERM(t *testing.T) {
	requireHoldHook(t)
	testenv.RequireRoot(t)
	base := busyboxBase(t)
	home := filepath.Join(t.TempDir(), "home")
	hold := t.TempDir()
	os.WriteFile(filepath.Join(hold, "release"), nil, 0o600) // not armed yet
	d := startDaemon(t, home, []string{testhook.HoldAtEnv + "=" + engine.PhaseCommit + ":" + hold})
	t.Cleanup(func() { cliRun(t, home, "sandbox", "rm", "s") })
	var created struct{ Root string }
	out, _ := mustCLI(t, home, "sandbox", "create", "s", "--base", base, "--json")
	json.Unmarshal([]byte(out), &created)

	cmd := cli(home, nil, "--lock-wait", "0s", "exec", "s", "--", "sh", "-c", "cat; echo to-stderr >&2; exit 3")
	cmd.Stdin = strings.NewReader("line one\nline two\n")
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != 3 || so.String() != "line one\nline two\n" || !strings.Contains(se.String(), "to-stderr") {
		t.Fatalf("exec through the daemon: exit %d, stdout %q, stderr %q", code, so.String(), se.String())
	}

	// A command that cannot run exits as a shell would, through the daemon
	// as directly: 127 not found, 126 not executable, said once.
	for _, c := range []struct {
		argv []string
		code int
		msg  string
	}{{[]string{"nosuch"}, 127, "nosuch: command not found"}, {[]string{"/bin"}, 126, "/bin"}} {
		out, errs, code := cliRun(t, home, append([]string{"--lock-wait", "0s", "exec", "s", "--"}, c.argv...)...)
		if code != c.code || strings.Count(errs, c.msg) != 1 {
			t.Errorf("exec %v through the daemon: exit %d (want %d), stdout %q, stderr %q", c.argv, code, c.code, out, errs)
		}
	}

	out, _ = mustCLI(t, home, "exec", "s", "--detach", "--log", "/tmp/server.log", "--json", "--", "sh", "-c", "echo serving; exec sleep 100000")
	var det struct{ PID int }
	if err := json.Unmarshal([]byte(out), &det); err != nil || det.PID <= 1 {
		t.Fatalf("exec --detach --json: %q (%v)", out, err)
	}
	check := "kill -0 " + strconv.Itoa(det.PID) + " && cat /tmp/server.log"
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, _, code := cliRun(t, home, "exec", "s", "--", "sh", "-c", check)
		if code == 0 && strings.Contains(out, "serving") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("detached pid %d not alive or its log empty: exit %d %q", det.PID, code, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	mustCLI(t, home, "checkpoint", "s") // the process is now in a checkpoint
	// CRIU's own statistics of that dump: in the record (log --json through
	// the daemon), inside the turn's pause, and in the daemon's histogram.
	out, _ = mustCLI(t, home, "log", "s", "--json")
	var logged []api.LogEntry
	if err := json.Unmarshal([]byte(out), &logged); err != nil || len(logged) == 0 {
		t.Fatalf("log --json: %q (%v)", out, err)
	}
	if d := logged[0].ProcDump; d == nil || d.FrozenMS <= 0 || d.FrozenMS > logged[0].PauseMS || d.PagesWritten == 0 {
		t.Fatalf("head's CRIU statistics %+v, pause %v ms", d, logged[0].PauseMS)
	}
	hcm := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return net.Dial("unix", filepath.Join(home, socketName))
	}}}
	if resp, err := hcm.Get("http://turnsnap/metrics"); err != nil {
		t.Fatal(err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), "turnsnap_criu_frozen_seconds_count 1\n") {
			t.Fatalf("/metrics has no CRIU frozen time of the one dump:\n%s", body)
		}
	}
	// ps through the daemon sees it, held by the head checkpoint.
	out, _ = mustCLI(t, home, "--lock-wait", "0s", "ps", "s", "--json")
	var ps struct {
		Running   bool
		Processes []struct {
			PID          int
			InCheckpoint bool `json:"in_checkpoint"`
		}
	}
	if err := json.Unmarshal([]byte(out), &ps); err != nil || !ps.Running || len(ps.Processes) == 0 {
		t.Fatalf("ps --json through the daemon: %q (%v)", out, err)
	}
	if p := ps.Processes[0]; p.PID != det.PID || !p.InCheckpoint {
		t.Fatalf("ps through the daemon: %+v, want pid %d in the checkpoint", ps.Processes, det.PID)
	}
	if out, _ := mustCLI(t, home, "ps", "s"); !strings.Contains(out, "sleep 100000") || !strings.Contains(out, "yes (") {
		t.Fatalf("ps through the daemon:\n%s", out)
	}

	// SSE: the same exec stream as server-sent events.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return net.Dial("unix", filepath.Join(home, socketName))
	}}}
	req, _ := http.NewRequest("POST", "http://turnsnap/v1/sandboxes/s/exec", strings.NewReader(`{"argv":["sh","-c","echo sse-out; exit 5"]}`))
	req.Header.Set("Accept", "text/event-stream")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// "sse-out\n" in base64 is c3NlLW91dAo=.
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" || !strings.Contains(string(body), "event: stdout\ndata: {\"data\":\"c3NlLW91dAo=\"}") ||
		!strings.Contains(string(body), "event: exit\ndata: {\"exit_code\":5}") {
		t.Fatalf("exec as SSE (%s):\n%s", ct, body)
	}

	// Hold the next commit, then SIGTERM.
	os.Remove(filepath.Join(hold, "release"))
	os.WriteFile(filepath.Join(created.Root, "during-shutdown"), []byte("kept\n"), 0o644)
	ck := cli(home, nil, "checkpoint", "s", "--json")
	var ckOut bytes.Buffer
	ck.Stdout = &ckOut
	if err := ck.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, filepath.Join(hold, "held"), "the checkpoint to reach its commit")
	d.cmd.Process.Signal(syscall.SIGTERM)
	// Stop accepting: the socket goes away while the commit is held.
	deadline = time.Now().Add(20 * time.Second)
	for {
		c, err := net.Dial("unix", filepath.Join(home, socketName))
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the daemon still accepts connections after SIGTERM")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-d.exited:
		t.Fatalf("the daemon exited with a commit in flight:\n%s", d.stderr.String())
	case <-time.After(200 * time.Millisecond):
	}
	os.WriteFile(filepath.Join(hold, "release"), nil, 0o600)
	if err := ck.Wait(); err != nil {
		t.Fatalf("checkpoint in flight at SIGTERM: %v: %s", err, ckOut.String())
	}
	var c struct{ ID, Class string }
	if err := json.Unmarshal(ckOut.Bytes(), &c); err != nil || c.Class != "fs" {
		t.Fatalf("checkpoint in flight at SIGTERM: %q (%v)", ckOut.String(), err)
	}
	if code := d.wait(t); code != 0 {
		t.Fatalf("daemon exit code %d after SIGTERM:\n%s", code, d.stderr.String())
	}
	// Direct mode now: the commit is there, and the process still runs.
	out, _ = mustCLI(t, home, "log", "s", "--json")
	if !strings.Contains(out, c.ID) {
		t.Fatalf("the commit finished during shutdown is not in the log: %s", out)
	}
	if out, _, code := cliRun(t, home, "exec", "s", "--", "sh", "-c", check); code != 0 || !strings.Contains(out, "serving") {
		t.Fatalf("the detached process did not survive the daemon's stop: exit %d %q", code, out)
	}
}

// kill -9 of the daemon while it holds a container frozen for a cut: the
// next daemon resumes it at start (beside serving) and says so in its log.
func TestServeKill9ResumesFreeze(t *testing.T) {
	testenv.RequireRoot(t)
	base := busyboxBase(t)
	home := filepath.Join(t.TempDir(), "home")
	mustCLI(t, home, "sandbox", "create", "k", "--base", base)
	t.Cleanup(func() { cliRun(t, home, "sandbox", "rm", "k") })
	mustCLI(t, home, "exec", "--detach", "k", "--", "sh", "-c",
		`n=0; while :; do n=$((n+1)); echo $n > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done`)
	mustCLI(t, home, "checkpoint", "k")
	flag := filepath.Join(t.TempDir(), "reached")
	d := startDaemon(t, home, []string{testhook.BlockAtEnv + "=" + engine.PhaseFreeze + ":" + flag})
	ck := cli(home, nil, "checkpoint", "k")
	if err := ck.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, flag, "the daemon's checkpoint to freeze the container")
	d.cmd.Process.Kill()
	<-d.exited
	ck.Wait()
	if code := ck.ProcessState.ExitCode(); code != exitUnavailable {
		t.Errorf("a checkpoint whose daemon was killed exits %d, want %d (unavailable)", code, exitUnavailable)
	}
	if !frozen(t, home, "k") {
		t.Fatal("the killed daemon did not leave the container frozen (the test proves nothing)")
	}
	// The killed daemon's socket is left behind; nobody answers there, so
	// a command opens the home directly (not found: it ran, not exit 6).
	if _, err := os.Stat(filepath.Join(home, socketName)); err != nil {
		t.Fatalf("no stale socket after kill -9 (the test proves nothing): %v", err)
	}
	if out, errs, code := cliRun(t, home, "--lock-wait", "0s", "tag", "--delete", "nosuch"); code != exitNotFound {
		t.Fatalf("a command beside a dead daemon's socket: exit %d %s %s", code, out, errs)
	}
	d2 := startDaemon(t, home, nil)
	// The repair runs beside serving (a daemon serves every other sandbox
	// at once): wait for its log line.
	for deadline := time.Now().Add(time.Minute); !strings.Contains(d2.stderr.String(), "repaired"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the new daemon did not repair the sandbox:\n%s", d2.stderr.String())
		}
	}
	if frozen(t, home, "k") {
		t.Fatalf("the new daemon left the container frozen:\n%s", d2.stderr.String())
	}
	if log := d2.stderr.String(); !strings.Contains(log, "repaired") || !strings.Contains(log, "sandbox=k") {
		t.Fatalf("the new daemon did not log what it repaired:\n%s", log)
	}
	n := counterValue(t, home, "k")
	deadline := time.Now().Add(30 * time.Second)
	for counterValue(t, home, "k") <= n {
		if time.Now().After(deadline) {
			t.Fatal("the resumed process does not run")
		}
	}
	var c struct{ Class string }
	out, _ := mustCLI(t, home, "checkpoint", "k", "--json")
	if json.Unmarshal([]byte(out), &c); c.Class != "process" && c.Class != "full" {
		t.Fatalf("checkpoint after the repair: %s", out)
	}
}
