package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/client"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/internal/testhook"
	"github.com/turnsnap/turnsnap/proc"
)

// lockedBuffer collects a daemon's stderr while tests read it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// daemonProc is a real `turnsnap serve` (the test binary acting as
// turnsnap) on a home.
type daemonProc struct {
	cmd    *exec.Cmd
	stderr *lockedBuffer
	home   string
	exited chan struct{}
}

// startDaemon starts turnsnap serve and waits until its socket answers.
func startDaemon(t testing.TB, home string, env []string, args ...string) *daemonProc {
	t.Helper()
	d := &daemonProc{cmd: cli(home, env, append([]string{"serve"}, args...)...), stderr: &lockedBuffer{}, home: home,
		exited: make(chan struct{})}
	d.cmd.Stderr = d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() { d.stop(t) })
	c, err := client.New(client.Options{Socket: filepath.Join(home, socketName)})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx)
		cancel()
		if err == nil {
			return d
		}
		select {
		case <-d.exited:
			t.Fatalf("turnsnap serve exited: %s", d.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("turnsnap serve does not answer: %v\n%s", err, d.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits; it returns the exit code (-1: killed).
func (d *daemonProc) stop(t testing.TB) int {
	select {
	case <-d.exited:
	default:
		d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(time.Minute):
			d.cmd.Process.Kill()
			<-d.exited
			t.Errorf("turnsnap serve did not stop on SIGTERM:\n%s", d.stderr.String())
		}
	}
	return d.cmd.ProcessState.ExitCode()
}

// wait waits for a daemon that was already told to stop; it returns the
// exit code.
func (d *daemonProc) wait(t *testing.T) int {
	select {
	case <-d.exited:
	case <-time.After(time.Minute):
		t.Fatalf("turnsnap serve did not exit:\n%s", d.stderr.String())
	}
	return d.cmd.ProcessState.ExitCode()
}

func (d *daemonProc) client(t testing.TB) *client.Client {
	c, err := client.New(client.Options{Socket: filepath.Join(d.home, socketName)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// busyboxBase is a base with busybox and a few applets, for containers.
func busyboxBase(t *testing.T, applets ...string) string {
	t.Helper()
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
	base := t.TempDir()
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp"} {
		os.MkdirAll(filepath.Join(base, d), 0o755)
	}
	os.WriteFile(filepath.Join(base, "bin/busybox"), bb, 0o755)
	for _, a := range append([]string{"sh", "sleep", "cat", "echo", "mv", "kill"}, applets...) {
		os.Symlink("busybox", filepath.Join(base, "bin", a))
	}
	return base
}

var (
	normPack = regexp.MustCompile(`packs/[0-9a-f]{2}/`)
	normID   = regexp.MustCompile(`\b[0-9a-f]{12,64}\b`)
	normDur  = regexp.MustCompile(`\b\d+(\.\d+)?(µs|ms|s|m)\b`)
	normTime = regexp.MustCompile(`\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?`)
	normSize = regexp.MustCompile(`\b\d+(\.\d+)? (B|KiB|MiB|GiB)\b`)
	// Sizes, durations and what a scan had to read (files in the scan
	// cache's racy window are read again) vary from run to run.
	normBytes = regexp.MustCompile(`("[a-z_]*(bytes|_ms|_ns|files_read)[a-z_]*": )[0-9.e+-]+`)
	// Where a turn's time went: which phases took measurable time is
	// itself timing.
	normPhases = regexp.MustCompile(`"phases_ms": \{[^}]*\}`)
	// A restore receipt says how its files were checked, which depends on
	// the mode: the daemon tracks changes, so it re-scans what the restore
	// wrote and has the state key at hand; direct mode trusts the
	// restore's own verification. Either way the receipt must match.
	normReceipt = regexp.MustCompile(`("(checked|got_state)": )"[^"]*"`)
)

// normalise replaces what differs between two homes running the same
// commands (ids, times, durations, sizes, the home's path).
func normalise(s, home string) string {
	s = regexp.MustCompile(regexp.QuoteMeta(home)).ReplaceAllString(s, "HOME")
	s = normTime.ReplaceAllString(s, "TIME")
	s = normPack.ReplaceAllString(s, "packs/XX/")
	s = normID.ReplaceAllString(s, "ID")
	s = normPhases.ReplaceAllString(s, `"phases_ms": PHASES`)
	s = normBytes.ReplaceAllString(s, "${1}N")
	s = normReceipt.ReplaceAllString(s, `${1}"HOW"`)
	s = normSize.ReplaceAllString(s, "SIZE")
	return normDur.ReplaceAllString(s, "DUR")
}

// requireHoldHook stops t unless this test binary, which runs as the
// daemon too, has the daemon's test hooks (go test -tags turnsnaptest).
func requireHoldHook(t *testing.T) {
	t.Helper()
	if !testhook.Enabled {
		testenv.Missing(t, "the daemon's hold hook (TURNSNAP_TEST_HOLD_AT)", "build the test with -tags turnsnaptest")
	}
}
