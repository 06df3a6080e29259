package proc

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// mustChanged snapshots id and checks Changed against prev.
func mustChanged(t *testing.T, rt *Runtime, id string, prev ProcSet, want bool, what string) ProcSet {
	t.Helper()
	cur, err := rt.Snapshot(testCtx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	got, why := Changed(prev, cur)
	if got != want {
		t.Errorf("%s: Changed = %v (%s), want %v", what, got, why, want)
	} else {
		t.Logf("%s: changed=%v %s", what, got, why)
	}
	return cur
}

func TestProcessChangeDetection(t *testing.T) {
	rt := newRuntime(t)
	ctx := testCtx(t)
	rootfs := busyboxRootfs(t)
	id := startKeeper(t, rt, rootfs)

	s0, err := rt.Snapshot(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(s0.Procs) != 0 {
		t.Fatalf("a fresh container's set holds %v; the keeper must be left out", s0.Procs)
	}

	// A turn that only ran commands that exited: not a process change.
	for _, argv := range [][]string{{"ls", "-la", "/"}, {"cat", "/proc/self/status"}, {"sh", "-c", "echo hi > /tmp/f; cat /tmp/f"}} {
		if code, err := rt.Exec(ctx, id, argv, nil, nil, nil); err != nil || code != 0 {
			t.Fatalf("%v: code %d err %v", argv, code, err)
		}
	}
	s1 := mustChanged(t, rt, id, s0, false, "ls and cat")

	// Starting a long-lived process is.
	pid, err := rt.ExecDetached(ctx, id, []string{"sleep", "1000"}, DetachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mustChanged(t, rt, id, s1, true, "sleep started")
	// The checkpoint this change causes takes the next baseline once the
	// new process has settled (ExecDetached returns while it may still be
	// starting up).
	s2, err := rt.Baseline(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(s2.Procs) != 1 || s2.Procs[0].PID != pid || s2.Procs[0].PPID != 1 || s2.Procs[0].Outside {
		t.Fatalf("set %+v; want the sleep (pid %d), a child of the init", s2.Procs, pid)
	}

	// A process that only sleeps between two snapshots is not, however
	// long the wait, and neither are exited commands around it.
	time.Sleep(500 * time.Millisecond)
	if _, err := rt.Exec(ctx, id, []string{"ls", "/tmp"}, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	s3 := mustChanged(t, rt, id, s2, false, "sleep only slept")

	// A process that does work is, and so is one that exits.
	busy, err := rt.ExecDetached(ctx, id, []string{"sh", "-c", "while :; do echo x > /tmp/busy; done"}, DetachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s4 := mustChanged(t, rt, id, s3, true, "busy loop started")
	time.Sleep(100 * time.Millisecond)
	s5 := mustChanged(t, rt, id, s4, true, "busy loop ran")
	if _, err := rt.Exec(ctx, id, []string{"kill", strconv.Itoa(busy), strconv.Itoa(pid)}, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "both to exit", func() bool { s, _ := rt.Snapshot(ctx, id); return len(s.Procs) == 0 })
	if changed, why := Changed(s5, ProcSet{}); !changed || !strings.Contains(why, "exited") {
		t.Errorf("processes gone: changed=%v %q", changed, why)
	}
}

// TestIdleAfterCheckpoint: the dump's own activity (CRIU's parasite, the
// syscalls it interrupted) must not make the next turn a process change,
// or every process checkpoint would cause the next.
func TestIdleAfterCheckpoint(t *testing.T) {
	rt := newRuntime(t)
	ctx := testCtx(t)
	rootfs := busyboxRootfs(t)
	id := startKeeper(t, rt, rootfs)
	for _, argv := range [][]string{{"sleep", "1000"}, {"httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"}} {
		if _, err := rt.ExecDetached(ctx, id, argv, DetachOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	before, err := rt.Baseline(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Checkpoint(ctx, id, filepath.Join(t.TempDir(), "img"), DumpOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := rt.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	// The dump itself touched every process: a comparison across it says so.
	after, err := rt.Snapshot(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if changed, why := Changed(before, after); !changed {
		t.Logf("the dump left no trace in the counters (%s)", why)
	}
	base, err := rt.Baseline(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := rt.Exec(ctx, id, []string{"cat", "/www/../proc/version"}, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	later := mustChanged(t, rt, id, base, false, "idle turn after a checkpoint")
	if changed, why := Changed(after, later); changed {
		t.Logf("against a plain Snapshot right after Resume, the idle turn would look changed: %s", why)
	}
}
