package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/proc"
)

// Tests of the process state a checkpoint must capture (issue 8): homes
// isolated from each other, files processes reference, tmpfs contents,
// bytes queued in pipes, device nodes. They need root, runc, CRIU and
// busybox (requireProcs).

// procCheckpoint checkpoints and fails unless the turn is classed want.
func procCheckpoint(t *testing.T, e *Engine, name string, want ...delta.Class) *CheckpointResult {
	t.Helper()
	r, err := e.Checkpoint(context.Background(), delta.SandboxName(name), CheckpointOptions{})
	must(t, err)
	for _, w := range want {
		if r.Class == w {
			return r
		}
	}
	t.Fatalf("sandbox %s: turn classed %s (%q), want %v", name, r.Class, r.ProcessChange, want)
	return nil
}

func detach(t *testing.T, e *Engine, name, script string) {
	t.Helper()
	_, err := e.Processes().Exec(context.Background(), delta.SandboxName(name), []string{"sh", "-c", script}, ExecOptions{Detach: true})
	must(t, err)
}

// pidsOf lists the container pids of the sandbox's long-lived processes.
func pidsOf(t *testing.T, e *Engine, name string) []int {
	t.Helper()
	rt, err := e.procs.Runtime(context.Background())
	must(t, err)
	set, err := rt.Snapshot(context.Background(), e.procs.ContainerID(name))
	must(t, err)
	var pids []int
	for _, p := range set.Procs {
		pids = append(pids, p.PID)
	}
	return pids
}

func TestHomesWithTheSameSandboxNameShareNothing(t *testing.T) {
	requireProcs(t)
	ctx := context.Background()
	base := busyboxBase(t)
	homes := []*Engine{newEngine(t), newEngine(t)}
	for _, e := range homes {
		_, err := e.CreateSandbox(ctx, "agent", CreateOptions{Base: base})
		must(t, err)
		detach(t, e, "agent", "while true; do sleep 3600; done")
	}
	// Both homes checkpoint their "agent" at the same time, twice.
	for round := range 2 {
		var wg sync.WaitGroup
		errs := make([]error, len(homes))
		for i, e := range homes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sh(t, e, "agent", fmt.Sprintf("echo %d > /tmp/round; sleep 0", round))
				detach(t, e, "agent", "sleep 1000")
				r, err := e.Checkpoint(ctx, "agent", CheckpointOptions{})
				if err == nil && r.Class != delta.ClassFull {
					err = fmt.Errorf("home %d round %d: classed %s", i, round, r.Class)
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		must(t, errors.Join(errs...))
	}
	// Every controller's cgroup carries the home's identity, and a pause of
	// one home's container leaves the other's running.
	var paths [2]string
	for i, e := range homes {
		rt, err := e.procs.Runtime(ctx)
		must(t, err)
		st, err := rt.State(ctx, e.procs.ContainerID("agent"))
		must(t, err)
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", st.InitPID))
		must(t, err)
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if !strings.Contains(line, e.procs.Scope()) {
				t.Fatalf("home %d: cgroup line %q lacks the home's scope %s", i, line, e.procs.Scope())
			}
		}
		paths[i] = string(b)
	}
	if paths[0] == paths[1] {
		t.Fatal("two homes' containers share cgroups")
	}
	rt0, _ := homes[0].procs.Runtime(ctx)
	rt1, _ := homes[1].procs.Runtime(ctx)
	must(t, rt0.Pause(ctx, homes[0].procs.ContainerID("agent")))
	st, err := rt1.Status(homes[1].procs.ContainerID("agent"))
	must(t, err)
	must(t, rt0.Resume(ctx, homes[0].procs.ContainerID("agent")))
	if st != proc.Running {
		t.Fatalf("pausing home 0's agent left home 1's %s", st)
	}
}

// A turn that changes a file a long-lived process holds open, or the binary
// it runs, dumps the processes again: the image carried forward would not
// fit the files. Rollback to that checkpoint restores files and processes.
func TestChangedReferencedFilesDumpProcesses(t *testing.T) {
	requireProcs(t)
	ctx := context.Background()
	e := newEngine(t)
	base := busyboxBase(t)
	steps := []struct{ what, script, path, want string }{
		{"open file appended", "echo more >> /data/log", "/data/log", "short\nmore"},
		{"open file replaced", "rm /data/log; echo 'longer new content' > /data/log", "/data/log", "longer new content"},
		{"binary replaced by rename (cp + mv)", "cp /bin/busybox /opt/bb.new && mv /opt/bb.new /opt/busybox", "/opt/busybox", "short"},
		{"binary rebuilt (rm + write, as go build -o)", "rm /opt/busybox && cp /bin/busybox /opt/busybox", "/opt/busybox", "short"},
	}
	for i, s := range steps {
		name := fmt.Sprintf("s%d", i)
		cr, err := e.CreateSandbox(ctx, delta.SandboxName(name), CreateOptions{Base: base})
		must(t, err)
		sh(t, e, name, "mkdir -p /data /opt && echo short > /data/log && cp /bin/busybox /opt/busybox")
		detach(t, e, name, "exec 3</data/log; while true; do sleep 3600; done")
		detach(t, e, name, "exec /opt/busybox sh -c 'while true; do /opt/busybox sleep 3600; done'")
		procCheckpoint(t, e, name, delta.ClassFull, delta.ClassProcess)
		procCheckpoint(t, e, name, delta.ClassSkip)
		pids := pidsOf(t, e, name)
		// Made from the host, as an agent's editor would: no process of the
		// container runs, so only the references can tell.
		must(t, os.WriteFile(filepath.Join(cr.Root, "step.sh"), []byte(s.script+"\n"), 0o755))
		must(t, exec.Command("chroot", cr.Root, "/bin/sh", "/step.sh").Run())
		must(t, os.Remove(filepath.Join(cr.Root, "step.sh")))
		r := procCheckpoint(t, e, name, delta.ClassFull)
		if !strings.Contains(r.ProcessChange, s.path) {
			t.Fatalf("%s: the process change %q does not name %s", s.what, r.ProcessChange, s.path)
		}
		procCheckpoint(t, e, name, delta.ClassSkip)
		sh(t, e, name, "echo later > /data/later")
		procCheckpoint(t, e, name, delta.ClassFS)
		res, err := e.Rollback(ctx, delta.SandboxName(name), mustRef(r.ID.String()), RollbackOptions{})
		if err != nil {
			t.Fatalf("%s: rollback to %s: %v", s.what, r.ID.Short(), err)
		}
		if !res.Processes {
			t.Fatalf("%s: rollback did not restore processes", s.what)
		}
		if got := pidsOf(t, e, name); fmt.Sprint(got) != fmt.Sprint(pids) {
			t.Fatalf("%s: after rollback processes %v, want %v", s.what, got, pids)
		}
		if got := sh(t, e, name, "cat /data/log; ls /data"); got != s.want+"\nlog" {
			t.Fatalf("%s: files after the rollback: %q", s.what, got)
		}
	}
}

// /dev/shm written by a command that exited is state: the turn is a process
// change even with no long-lived process, and a branch has the file.
// Bytes an exited command left in a pipe a process holds are state too.
func TestTmpfsAndQueuedBytesAreProcessState(t *testing.T) {
	requireProcs(t)
	ctx := context.Background()
	e := newEngine(t)
	_, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: busyboxBase(t)})
	must(t, err)
	sh(t, e, "s", "echo in-shm > /dev/shm/note")
	r := procCheckpoint(t, e, "s", delta.ClassProcess)
	if !strings.Contains(r.ProcessChange, "tmpfs") {
		t.Fatalf("shm turn: reason %q", r.ProcessChange)
	}
	procCheckpoint(t, e, "s", delta.ClassSkip)
	b, err := e.Branch(ctx, mustRef(r.ID.String()), "shm-branch", BranchOptions{})
	must(t, err)
	if !b.Processes {
		t.Fatal("branch of a checkpoint with /dev/shm contents restored no container")
	}
	if got := sh(t, e, "shm-branch", "cat /dev/shm/note"); got != "in-shm" {
		t.Fatalf("branch's /dev/shm/note: %q", got)
	}

	sh(t, e, "s", "mkfifo /tmp/pipe")
	detach(t, e, "s", "exec 3<>/tmp/pipe; while true; do sleep 3600; done")
	procCheckpoint(t, e, "s", delta.ClassFull, delta.ClassProcess)
	procCheckpoint(t, e, "s", delta.ClassSkip)
	sh(t, e, "s", "echo msg > /tmp/pipe")
	q := procCheckpoint(t, e, "s", delta.ClassFull, delta.ClassProcess)
	if !strings.Contains(q.ProcessChange, "bytes waiting") {
		t.Fatalf("queued bytes turn: reason %q", q.ProcessChange)
	}
	sh(t, e, "s", "dd if=/tmp/pipe bs=4 count=1 2>/dev/null >/dev/null") // drain
	procCheckpoint(t, e, "s", delta.ClassFull, delta.ClassProcess)
	_, err = e.Rollback(ctx, "s", mustRef(q.ID.String()), RollbackOptions{})
	must(t, err)
	if got := sh(t, e, "s", "dd if=/tmp/pipe bs=4 count=1 2>/dev/null"); got != "msg" {
		t.Fatalf("after rollback the pipe holds %q, want the queued msg", got)
	}
}

// One rule for device nodes, the same at checkpoint, verify and restore; and
// a restore that cannot succeed is refused before it stops anything.
func TestDeviceNodesAndSafeRestore(t *testing.T) {
	requireProcs(t)
	ctx := context.Background()
	// The test forges a record holding a refused device: its store is
	// hostile on purpose, so the store-only oracle would report the forgery.
	e := openEngineOracle(t, filepath.Join(t.TempDir(), "home"), false)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: busyboxBase(t)})
	must(t, err)
	sh(t, e, "s", "mknod /tmp/null c 1 3 && mknod /tmp/sda b 8 0")
	_, err = e.Checkpoint(ctx, "s", CheckpointOptions{})
	if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), "sda") {
		t.Fatalf("checkpoint of a root holding a block device: %v", err)
	}
	sh(t, e, "s", "rm /tmp/sda")
	detach(t, e, "s", "while true; do sleep 3600; done")
	good := procCheckpoint(t, e, "s", delta.ClassFull)
	if _, err := e.Verifier().Verify(ctx, mustRef(good.ID.String())); err != nil {
		t.Fatalf("verify of a checkpoint with /tmp/null: %v", err)
	}
	pids := pidsOf(t, e, "s")

	// A checkpoint whose files hold a block device (made elsewhere, or by an
	// older turnsnap): verify and rollback refuse it, and the running
	// processes survive the refused rollback.
	head, err := e.Resolve(ctx, mustRef(good.ID.String()))
	must(t, err)
	tree, err := delta.LoadTree(ctx, e.data.repo, head.FSTree)
	must(t, err)
	tree.Entries = append(tree.Entries, delta.Entry{Name: "zz-sda", Type: delta.TypeBlockDev, Mode: 0o600, Rdev: 8 << 8})
	data := tree.Encode()
	op := e.data.repo.Begin()
	_, err = op.SaveBlob(ctx, delta.BlobTree, delta.Hash(data), data)
	must(t, err)
	must(t, op.Publish(ctx))
	forged := *head
	forged.FSTree, forged.ID, forged.Message = delta.Hash(data), [32]byte{}, "forged device"
	must(t, putRecord(ctx, e.stores.front, &forged))
	must(t, e.cat.Update(ctx, func(tx *catalog.Tx) error { return tx.PutCheckpoint(&forged) }))
	if _, err := e.Verifier().Verify(ctx, mustRef(forged.ID.String())); err == nil || !strings.Contains(err.Error(), "zz-sda") {
		t.Fatalf("verify of a checkpoint holding a block device: %v", err)
	}
	missing := *head
	bogus := delta.Hash([]byte("no such image"))
	missing.ProcTree, missing.ID, missing.Message = &bogus, [32]byte{}, "image lost"
	must(t, putRecord(ctx, e.stores.front, &missing))
	must(t, e.cat.Update(ctx, func(tx *catalog.Tx) error { return tx.PutCheckpoint(&missing) }))
	write(t, filepath.Join(cr.Root, "tmp/after"), "kept")
	for _, bad := range []*delta.Checkpoint{&forged, &missing} {
		if _, err := e.Rollback(ctx, "s", mustRef(bad.ID.String()), RollbackOptions{}); err == nil {
			t.Fatalf("rollback to %q succeeded", bad.Message)
		}
		if got := pidsOf(t, e, "s"); fmt.Sprint(got) != fmt.Sprint(pids) {
			t.Fatalf("a refused rollback to %q left processes %v, want %v running", bad.Message, got, pids)
		}
		if b, err := os.ReadFile(filepath.Join(cr.Root, "tmp/after")); err != nil || string(b) != "kept" {
			t.Fatalf("a refused rollback to %q changed the files: %q %v", bad.Message, b, err)
		}
	}
	// The pseudo device comes back with the good checkpoint.
	_, err = e.Rollback(ctx, "s", mustRef(good.ID.String()), RollbackOptions{})
	must(t, err)
	if got := sh(t, e, "s", "stat -c %t:%T:%F /tmp/null"); got != "1:3:character special file" {
		t.Fatalf("/tmp/null after rollback: %q", got)
	}
}

// A library a process has mapped, replaced the way pip install --upgrade
// replaces it (write a new file, rename it over), is a process change.
func TestReplacedMappedLibraryDumpsProcesses(t *testing.T) {
	requireProcs(t)
	ctx := context.Background()
	base := busyboxBase(t)
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(base, "bin/mapper"), "./testdata/mapper")
	build.Dir = "../proc"
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build mapper: %v: %s", err, out)
	}
	must(t, os.MkdirAll(filepath.Join(base, "lib"), 0o755))
	must(t, os.WriteFile(filepath.Join(base, "lib/libdemo.so"), []byte(strings.Repeat("v1 library\n", 1000)), 0o644))
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: base})
	must(t, err)
	_, err = e.Processes().Exec(ctx, "s", []string{"/bin/mapper", "/lib/libdemo.so", "/tmp/ready"}, ExecOptions{Detach: true})
	must(t, err)
	waitFile(t, filepath.Join(cr.Root, "tmp/ready"))
	procCheckpoint(t, e, "s", delta.ClassFull, delta.ClassProcess)
	pids := pidsOf(t, e, "s")
	write(t, filepath.Join(cr.Root, "lib/libdemo.so.new"), strings.Repeat("v2 library, longer\n", 1000))
	must(t, os.Rename(filepath.Join(cr.Root, "lib/libdemo.so.new"), filepath.Join(cr.Root, "lib/libdemo.so")))
	r := procCheckpoint(t, e, "s", delta.ClassFull)
	if !strings.Contains(r.ProcessChange, "mapped /lib/libdemo.so") {
		t.Fatalf("process change %q does not name the mapped library", r.ProcessChange)
	}
	sh(t, e, "s", "rm /lib/libdemo.so")
	procCheckpoint(t, e, "s", delta.ClassFS)
	res, err := e.Rollback(ctx, "s", mustRef(r.ID.String()), RollbackOptions{})
	must(t, err)
	if !res.Processes || fmt.Sprint(pidsOf(t, e, "s")) != fmt.Sprint(pids) {
		t.Fatalf("rollback: processes %v %v, want %v", res.Processes, pidsOf(t, e, "s"), pids)
	}
	if got := sh(t, e, "s", "head -1 /lib/libdemo.so"); got != "v2 library, longer" {
		t.Fatalf("library after rollback: %q", got)
	}
}

func waitFile(t *testing.T, p string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(p); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", p)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A checkpoint an older turnsnap took (files changed, processes idle, the
// parent's image carried forward although a process held a changed file) is
// refused before the running processes are stopped; --fs-only restores it.
func TestRollbackRefusesAnImageThatDoesNotFitItsFiles(t *testing.T) {
	requireProcs(t)
	ctx := context.Background()
	e := openEngineOracle(t, filepath.Join(t.TempDir(), "home"), false) // it forges a record in the catalog
	_, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: busyboxBase(t)})
	must(t, err)
	sh(t, e, "s", "mkdir /data && echo short > /data/log")
	detach(t, e, "s", "exec 3</data/log; while true; do sleep 3600; done")
	a := procCheckpoint(t, e, "s", delta.ClassFull)
	sh(t, e, "s", "echo 'longer new content' > /data/log")
	b := procCheckpoint(t, e, "s", delta.ClassFull)
	ca, err := e.Resolve(ctx, mustRef(a.ID.String()))
	must(t, err)
	cb, err := e.Resolve(ctx, mustRef(b.ID.String()))
	must(t, err)
	old := *cb
	old.ProcTree, old.Host, old.Class, old.ID, old.Message = ca.ProcTree, ca.Host, delta.ClassFS, [32]byte{}, "as an older turnsnap classed it"
	must(t, putRecord(ctx, e.stores.front, &old))
	must(t, e.cat.Update(ctx, func(tx *catalog.Tx) error { return tx.PutCheckpoint(&old) }))
	pids := pidsOf(t, e, "s")
	_, err = e.Rollback(ctx, "s", mustRef(old.ID.String()), RollbackOptions{})
	if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), "/data/log") || !strings.Contains(err.Error(), "--fs-only") {
		t.Fatalf("rollback to a checkpoint whose image does not fit: %v", err)
	}
	if got := pidsOf(t, e, "s"); fmt.Sprint(got) != fmt.Sprint(pids) {
		t.Fatalf("the refused rollback left processes %v, want %v", got, pids)
	}
	r, err := e.Rollback(ctx, "s", mustRef(old.ID.String()), RollbackOptions{FSOnly: true})
	must(t, err)
	if r.Processes {
		t.Fatal("--fs-only restored processes")
	}
	if got := sh(t, e, "s", "cat /data/log"); got != "longer new content" {
		t.Fatalf("files after --fs-only: %q", got)
	}
}
