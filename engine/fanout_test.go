package engine

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/overlay"
)

// Needs root, overlayfs, runc, busybox-static and CRIU (requireProcs).

// fanoutWebParent makes sandbox "web" running busybox httpd on its page
// and checkpoints it (class full), its layer frozen.
func fanoutWebParent(t *testing.T, e *Engine) *CheckpointResult {
	t.Helper()
	ctx := context.Background()
	cr, err := e.CreateSandbox(ctx, "web", CreateOptions{Base: busyboxBase(t)})
	must(t, err)
	write(t, filepath.Join(cr.Root, "src/main.go"), "package main\n")
	_, err = e.Processes().Exec(ctx, "web", []string{"httpd", "-f", "-p", "8080", "-h", "/www"}, ExecOptions{Detach: true})
	must(t, err)
	waitAnswer(t, e, "web")
	c, err := e.Checkpoint(ctx, "web", CheckpointOptions{})
	must(t, err)
	if c.Class != delta.ClassFull {
		t.Fatalf("the parent's checkpoint classed %s, want full", c.Class)
	}
	e.WaitFreezes()
	return c
}

// TestFanoutRestoresEveryServer: a fan-out of 5 branches (more than the
// restores run at once, restoreWorkers) of a checkpoint whose server
// runs: every branch stacks on the frozen layer, its receipt holds (files
// and processes), its own restored server answers in its own network
// namespace, and the parent's server, killed after the cut, stays dead
// in the parent (a branch's restore never touches another container).
func TestFanoutRestoresEveryServer(t *testing.T) {
	requireProcs(t)
	ctx := context.Background()
	e := newEngine(t)
	c := fanoutWebParent(t, e)
	sh(t, e, "web", "killall httpd")
	names, err := BranchNames("fo", restoreWorkers()+2)
	must(t, err)
	rs, err := e.BranchMany(ctx, mustRef(c.ID.String()), sandboxNames(names), BranchOptions{})
	must(t, err)
	if len(rs) != len(names) {
		t.Fatalf("%d results for %d branches", len(rs), len(names))
	}
	// A branch's first turn is its own: nothing ran since its restore (its
	// server not yet asked), so a skip.
	r0, err := e.Checkpoint(ctx, delta.SandboxName(names[0]), CheckpointOptions{})
	must(t, err)
	if r0.Class != delta.ClassSkip {
		t.Fatalf("the first turn of an untouched branch classed %s", r0.Class)
	}
	for i, r := range rs {
		if r.Sandbox != names[i] {
			t.Fatalf("result %d is %s, want %s (the order of the names)", i, r.Sandbox, names[i])
		}
		if !r.Processes || !r.Receipt.OK || r.Receipt.Processes == nil || !r.Receipt.Processes.Match {
			t.Fatalf("branch %s: processes %v, receipt %+v", r.Sandbox, r.Processes, r.Receipt)
		}
		if overlay.FrozenUser(e.home.sandboxDir(delta.SandboxName(r.Sandbox))) == "" {
			t.Fatalf("branch %s does not stack on the frozen layer", r.Sandbox)
		}
		if r.Phases == nil || r.Phases.Processes <= 0 || r.Phases != rs[0].Phases {
			t.Fatalf("branch %s: phases %+v, want the fan-out's one record with a processes phase", r.Sandbox, r.Phases)
		}
		waitAnswer(t, e, r.Sandbox)
	}
	if _, err := httpGetIn(sandboxNetns(e, "web"), "127.0.0.1:8080", "/index.html"); err == nil {
		t.Fatal("the parent's server, killed after the cut, answers again")
	}
	must(t, e.RemoveSandbox(ctx, delta.SandboxName(names[0])))
	if _, err := os.Stat(filepath.Join(e.procs.StateRoot(), "runc", e.procs.ContainerID(names[0]))); !os.IsNotExist(err) {
		t.Fatalf("branch %s removed, its container's state stays: %v", names[0], err)
	}
}

// TestKilledFanoutHelper is the process TestKilledFanoutRecovers kills:
// with its environment set, it fans out and SIGKILLs itself as the first
// branch's processes are checked, while the other restores run.
func TestKilledFanoutHelper(t *testing.T) {
	home, target := os.Getenv("TS_FANOUT_HOME"), os.Getenv("TS_FANOUT_TARGET")
	if home == "" {
		t.Skip("helper process only")
	}
	e, err := Open(context.Background(), Options{Home: home})
	must(t, err)
	e.opts.AtPhase = func(p string) {
		if p == PhaseReceiptProcesses {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	}
	names, err := BranchNames("fo", 4)
	must(t, err)
	e.BranchMany(context.Background(), mustRef(target), sandboxNames(names), BranchOptions{})
	t.Fatal("not killed")
}

// TestKilledFanoutRecovers: a fan-out SIGKILLed while its branches'
// processes are being restored side by side. The branches were recorded
// all together before any restore, so all four exist, each with the
// checkpoint as its head and its files; whatever state its container was
// left in (restored, half restored by a runc that died with turnsnap, or
// never started), the next command on each heals it: a checkpoint
// succeeds, removal leaves no container state (runc's, and the root a
// killed `runc restore` left bind-mounted in it: proc/deadstate.go) and
// no root behind, and the same names branch again with every server
// answering.
func TestKilledFanoutRecovers(t *testing.T) {
	requireProcs(t)
	ctx := context.Background()
	home := filepath.Join(t.TempDir(), "home")
	e := openEngine(t, home)
	c := fanoutWebParent(t, e)
	must(t, e.Close())

	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledFanoutHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TS_FANOUT_HOME="+home, "TS_FANOUT_TARGET="+c.ID.String())
	out, _ := cmd.CombinedOutput()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the fan-out was not killed: %s", out)
	}

	e = openEngine(t, home)
	names, err := BranchNames("fo", 4)
	must(t, err)
	for _, n := range names {
		name := delta.SandboxName(n)
		var head delta.ID
		err := e.view(ctx, func(tx *catalog.Tx) (err error) {
			head, err = tx.GetRef(delta.RefHead, n)
			return err
		})
		if err != nil || head != c.ID {
			t.Fatalf("branch %s after the kill: head %s, %v; want %s", n, head.Short(), err, c.ID.Short())
		}
		if _, err := e.Checkpoint(ctx, name, CheckpointOptions{}); err != nil {
			t.Fatalf("branch %s after the kill: checkpoint: %v", n, err)
		}
		must(t, e.RemoveSandbox(ctx, name))
		if _, err := os.Stat(filepath.Join(e.procs.StateRoot(), "runc", e.procs.ContainerID(n))); !os.IsNotExist(err) {
			t.Fatalf("branch %s removed, its container's state stays: %v", n, err)
		}
		if _, err := os.Stat(e.home.sandboxDir(name)); !os.IsNotExist(err) {
			t.Fatalf("branch %s removed, its root stays: %v", n, err)
		}
	}
	rs, err := e.BranchMany(ctx, mustRef(c.ID.String()), sandboxNames(names), BranchOptions{})
	must(t, err)
	for _, r := range rs {
		if !r.Processes || !r.Receipt.OK {
			t.Fatalf("branch %s again: processes %v, receipt %+v", r.Sandbox, r.Processes, r.Receipt)
		}
		waitAnswer(t, e, r.Sandbox)
	}
}
