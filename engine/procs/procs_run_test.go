package procs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/proc"
)

// These tests run containers: they need root, runc, CRIU and busybox-static
// (scripts/deps.d/30-proc.sh installs them).

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

// busyboxRoot is a minimal root a container can run: busybox and its
// applets, and the directories a container mounts over.
func busyboxRoot(t testing.TB) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp", "root"} {
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
	return root
}

// runFixture is a fixture whose sandbox "s" runs in a container on a
// busybox root; the container is stopped when the test ends.
func runFixture(t *testing.T) (*fixture, string) {
	requireProcs(t)
	root := busyboxRoot(t)
	f := newFixture(t, root)
	t.Cleanup(func() {
		if err := f.m.Stop(context.Background(), f.m.Container("s")); err != nil {
			t.Errorf("stop: %v", err)
		}
		os.RemoveAll(f.m.StateRoot())
	})
	return f, root
}

func pids(t *testing.T, m *Manager) []int {
	t.Helper()
	set, err := m.Snapshot(context.Background(), m.Container("s"))
	must(t, err)
	var out []int
	for _, p := range set.Procs {
		out = append(out, p.PID)
	}
	slices.Sort(out)
	return out
}

// Exec starts the container on first use and runs commands in it, naming
// the sandbox in a command that cannot run.
func TestExecStartsTheContainer(t *testing.T) {
	ctx := context.Background()
	f, root := runFixture(t)
	var out, errb bytes.Buffer
	code, err := f.m.Exec(ctx, "s", []string{"sh", "-c", "echo hi; echo there >&2; echo file > /tmp/f; exit 3"},
		ExecOptions{Stdout: &out, Stderr: &errb})
	if err != nil || code != 3 || out.String() != "hi\n" || errb.String() != "there\n" {
		t.Fatalf("exec: code %d err %v stdout %q stderr %q", code, err, out.String(), errb.String())
	}
	if b, err := os.ReadFile(filepath.Join(root, "tmp/f")); err != nil || string(b) != "file\n" {
		t.Fatalf("the command's file on the root: %q %v", b, err)
	}
	if running, err := f.m.Running(ctx, f.m.Container("s")); err != nil || !running {
		t.Fatalf("after exec: running %v %v", running, err)
	}
	_, err = f.m.Exec(ctx, "s", []string{"no-such-command"}, ExecOptions{})
	var ce *CommandError
	if !errors.As(err, &ce) || ce.Code != 127 || !strings.Contains(err.Error(), "sandbox s") {
		t.Fatalf("a missing command: %v", err)
	}
	for _, bad := range []ExecOptions{{Detach: true, Log: "relative"}, {Detach: true, Log: "/tmp/../x"}} {
		if _, err := f.m.Exec(ctx, "s", []string{"true"}, bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("log %q: %v", bad.Log, err)
		}
	}
	if _, err := f.m.Exec(ctx, "s", nil, ExecOptions{}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("no command: %v", err)
	}
	// Resume of a running container that nobody froze is a no-op.
	r, err := f.m.Resume(ctx, "s")
	if err != nil || r.WasFrozen {
		t.Fatalf("resume: %+v %v", r, err)
	}
}

// A turn's process half end to end: a new process is a change, paused for
// the cut and dumped; stored, settled and listed as in the checkpoint; the
// next turn is no change; a restore from the stored image brings the
// process back with its pid.
func TestTurnDumpsAndRestoresProcesses(t *testing.T) {
	ctx := context.Background()
	f, root := runFixture(t)
	pid, err := f.m.Exec(ctx, "s", []string{"sh", "-c", "while :; do sleep 3600; done"}, ExecOptions{Detach: true})
	must(t, err)
	time.Sleep(300 * time.Millisecond)

	pt, err := f.m.BeginTurn(ctx, f.m.Container("s"), f.head)
	must(t, err)
	if !pt.Running || !pt.Changed || !strings.Contains(pt.Reason, "not yet in any checkpoint") {
		t.Fatalf("first turn: %+v", pt)
	}
	if st, err := f.m.rt.Status(f.m.ContainerID("s")); err != nil || st != proc.Paused {
		t.Fatalf("a changed turn left the container %s (%v)", st, err)
	}
	store, dump, err := f.m.Dump(ctx, f.m.Container("s"), f.blobs)
	must(t, err)
	pt.Resume()
	tree, host, err := store()
	must(t, err)
	blobs := 0
	phases := slices.DeleteFunc(slices.Clone(f.phases), func(p string) bool {
		if p == PhaseImageBlob {
			blobs++
		}
		return p == PhaseImageBlob
	})
	if pt.Paused <= 0 || fmt.Sprint(phases) != "[freeze dump store]" || blobs == 0 ||
		slices.Index(f.phases, PhaseImageBlob) < slices.Index(f.phases, PhaseStore) {
		t.Fatalf("paused %v, phases %v", pt.Paused, f.phases)
	}
	// CRIU's own figures: it wrote pages, and the time it kept the
	// processes frozen lies inside turnsnap's freeze-to-thaw pause.
	if dump == nil || dump.FrozenNs <= 0 || dump.FrozenNs > pt.Paused.Nanoseconds() || dump.PagesWritten == 0 {
		t.Fatalf("CRIU statistics %+v (pause %v)", dump, pt.Paused)
	}
	if ents, _ := os.ReadDir(f.m.WorkDir()); len(ents) != 0 {
		t.Fatalf("the dump left %d work dirs", len(ents))
	}
	f.m.Settle(ctx, f.m.Container("s"))
	cp := &delta.Checkpoint{ID: delta.Hash([]byte("cp")), ProcTree: &tree, Host: host}
	f.head = cp
	must(t, f.m.CheckHost(ctx, cp))

	pt, err = f.m.BeginTurn(ctx, f.m.Container("s"), cp)
	must(t, err)
	if !pt.Running || pt.Changed {
		t.Fatalf("an idle turn after the dump: %+v", pt)
	}
	if rescan, err := f.m.ConfirmIdle(ctx, f.m.Container("s"), pt, cp); err != nil || rescan {
		t.Fatalf("confirm idle: %v %v", rescan, err)
	}
	pt.Resume()
	l, err := f.m.List(ctx, "s", ProcessesOptions{})
	must(t, err)
	if !l.Running || !l.HeadHasImage || !slices.ContainsFunc(l.Processes, func(p ProcessInfo) bool { return p.PID == pid && p.InCheckpoint }) {
		t.Fatalf("list: %+v (want pid %d in the checkpoint)", l, pid)
	}
	before := pids(t, f.m)

	must(t, os.MkdirAll(f.m.Dir(), 0o700))
	must(t, os.WriteFile(f.m.RestoredFile("s"), []byte("x"), 0o600))
	must(t, f.m.Stop(ctx, f.m.Container("s")))
	if running, err := f.m.Running(ctx, f.m.Container("s")); err != nil || running {
		t.Fatalf("after stop: running %v %v", running, err)
	}
	for _, p := range []string{f.m.baselineFile("s"), f.m.RestoredFile("s")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("stop left %s: %v", filepath.Base(p), err)
		}
	}
	pt, err = f.m.BeginTurn(ctx, f.m.Container("s"), cp)
	must(t, err)
	if pt.Running || !pt.Changed || !strings.Contains(pt.Reason, "ended") {
		t.Fatalf("a turn after the processes ended: %+v", pt)
	}

	img, done, err := f.m.Image(ctx, cp)
	must(t, err)
	defer done()
	must(t, f.m.Restore(ctx, f.m.Container("s"), root, img, cp))
	if got := pids(t, f.m); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Fatalf("restored processes %v, want %v", got, before)
	}
	if _, err := os.Stat(f.m.baselineFile("s")); err != nil {
		t.Fatalf("a restore settles its baseline: %v", err)
	}
	inv, err := f.m.Inventory(ctx, "s")
	must(t, err)
	want, err := proc.ImageInventory(img)
	must(t, err)
	if missing, _ := want.Compare(inv); len(missing) != 0 {
		t.Fatalf("the restored container lacks %v", missing)
	}
}

// A freeze whose holder is gone (a turnsnap killed mid-checkpoint) is
// thawed by the next look at the container, and Recover says so.
func TestStaleFreezeIsRecovered(t *testing.T) {
	ctx := context.Background()
	f, _ := runFixture(t)
	_, err := f.m.Exec(ctx, "s", []string{"sleep", "3600"}, ExecOptions{Detach: true})
	must(t, err)
	id := f.m.ContainerID("s")
	// A child pauses the container and dies: the freeze's holder is gone.
	helper := exec.Command("runc", "--root", filepath.Join(f.m.StateRoot(), "runc"), "pause", id)
	if out, err := helper.CombinedOutput(); err != nil {
		t.Skipf("runc pause from a child: %v: %s", err, out)
	}
	fs, err := f.m.rt.Freeze(id)
	must(t, err)
	if !fs.Frozen || !fs.Stale() {
		t.Fatalf("the child's freeze: %+v", fs)
	}
	resumed, running, err := f.m.Recover(ctx, "s")
	if err != nil || !resumed || !running {
		t.Fatalf("recover: resumed %v running %v err %v", resumed, running, err)
	}
	if fs, err := f.m.rt.Freeze(id); err != nil || fs.Frozen {
		t.Fatalf("after recover: %+v %v", fs, err)
	}
}
