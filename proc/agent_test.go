package proc

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The agent's processes are found from the root of their outside tree, and
// a dump log's "Unexpected process" lines name only the others.
func TestAgentRootsAndLeftOut(t *testing.T) {
	// 10 is the init; 20 a command runc exec started (its parent 5 is runc,
	// outside), 21 and 22 its descendants; 30 a process the init adopted.
	parents := map[int]int{10: 1, 20: 5, 21: 20, 22: 21, 30: 10}
	parent := func(h int) (int, bool) { p, ok := parents[h]; return p, ok }
	for pid, want := range map[int]int{20: 20, 21: 20, 22: 20, 30: 10} {
		if got := outsideRoot(pid, parent); got != want {
			t.Errorf("outsideRoot(%d) = %d, want %d", pid, got, want)
		}
	}
	log := []byte("(00.01) Warn (criu/cgroup.c:1): Unexpected process 4242 in the freezer cgroup (status 0x1)\n" +
		"(00.01) Warn (criu/cgroup.c:1): Unexpected process 4243 in the freezer cgroup (status 0x1)\n")
	if got := leftOut(log, []int{4242}); !slices.Equal(got, []int{4243}) {
		t.Errorf("leftOut = %v, want [4243]", got)
	}
	if got := leftOut(log, []int{4242, 4243}); len(got) != 0 {
		t.Errorf("leftOut with both the agent's = %v", got)
	}
	// This test's own environment has no marker; a child's with it would.
	if isAgentRoot(os.Getpid()) && os.Getenv("TURNSNAP_AGENT") != "1" {
		t.Error("a process without the marker reads as the agent")
	}
}

// A command Exec started with AgentEnv is the agent's: Snapshot lists it
// (and its children) apart from the sandbox's processes, and a dump of the
// container goes ahead without it, holding the sandbox's own process.
func TestAgentExecLeftOutOfSnapshotAndDump(t *testing.T) {
	rt := newRuntime(t)
	ctx := testCtx(t)
	id := startKeeper(t, rt, busyboxRootfs(t))
	if _, err := rt.ExecDetached(ctx, id, []string{"sleep", "1000"}, DetachOptions{}); err != nil {
		t.Fatal(err)
	}
	execCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = rt.Exec(execCtx, id, []string{"env", AgentEnv, "sh", "-c", "sleep 30; :"}, nil, nil, nil)
	}()
	t.Cleanup(func() { cancel(); <-done })
	var s ProcSet
	waitFor(t, 10*time.Second, "the agent and its child to show", func() bool {
		var err error
		s, err = rt.Snapshot(ctx, id)
		return err == nil && len(s.Agent) == 2 && strings.Join(s.Agent[1].Cmdline, " ") == "sleep 30"
	})
	if len(s.Procs) != 1 || strings.Join(s.Procs[0].Cmdline, " ") != "sleep 1000" {
		t.Fatalf("sandbox processes %v, want the detached sleep only (agent: %v)", s.Procs, s.Agent)
	}
	img := filepath.Join(t.TempDir(), "img")
	if _, err := rt.Checkpoint(ctx, id, img, DumpOptions{}); err != nil {
		t.Fatalf("Checkpoint while the agent runs: %v", err)
	}
	inv, err := ImageInventory(img)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range inv.Procs {
		if p.PID == s.Agent[0].PID || p.PID == s.Agent[1].PID {
			t.Errorf("the image holds the agent's process %+v (image: %+v)", p, inv.Procs)
		}
	}
	if !slices.ContainsFunc(inv.Procs, func(p InventoryProc) bool { return p.PID == s.Procs[0].PID }) {
		t.Errorf("the image lacks the sandbox's sleep: %+v", inv.Procs)
	}
}

// The agent's own files (AgentArgv points HOME, TMPDIR and the rest at
// AgentStateDir) are not sandbox state: they are not in the sandbox root,
// change no tmpfs digest, leave the container pristine, and a restored
// container holds none of them, though the dump took the tmpfs whole.
func TestAgentStateNotSandboxState(t *testing.T) {
	rt := newRuntime(t)
	ctx := testCtx(t)
	rootfs := busyboxRootfs(t)
	id := startKeeper(t, rt, rootfs)
	before, err := rt.Snapshot(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	script := `mkdir -p "$CLAUDE_CONFIG_DIR" "$XDG_CACHE_HOME" && echo s > "$CLAUDE_CONFIG_DIR/session" && echo t > "$TMPDIR/sock" &&
		echo c > "$XDG_CACHE_HOME/c" && chmod 700 "$HOME" && test "$HOME" = ` + AgentStateDir
	var errOut strings.Builder
	if code, err := rt.Exec(ctx, id, AgentArgv([]string{"sh", "-c", script}), nil, nil, &errOut); code != 0 || err != nil {
		t.Fatalf("the agent's writes: exit %d, %v: %s", code, err, errOut.String())
	}
	after, err := rt.Snapshot(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if changed, why := Changed(before, after); changed || !after.TmpfsPristine || after.NeedsImage() {
		t.Fatalf("the agent's own files changed the sandbox: %v %q, pristine %v (tmpfs %+v)", changed, why, after.TmpfsPristine, after.Tmpfs)
	}
	for _, tm := range after.Tmpfs {
		if tm.Mount == AgentStateDir {
			t.Errorf("the agent's tmpfs is digested: %+v", tm)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(rootfs, "root")); len(ents) > 0 {
		t.Errorf("the agent's files are in the sandbox root: %v", ents)
	}
	// A file of the sandbox's own in /dev/shm still is a change.
	if code, err := rt.Exec(ctx, id, []string{"sh", "-c", "echo x > /dev/shm/x"}, nil, nil, nil); code != 0 || err != nil {
		t.Fatalf("write /dev/shm: exit %d, %v", code, err)
	}
	if _, err := rt.ExecDetached(ctx, id, []string{"sleep", "1000"}, DetachOptions{}); err != nil {
		t.Fatal(err)
	}
	shm, err := rt.Snapshot(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if changed, _ := Changed(after, shm); !changed {
		t.Fatal("a file in /dev/shm and a new process read as no change")
	}
	img := filepath.Join(t.TempDir(), "img")
	if _, err := rt.Checkpoint(ctx, id, img, DumpOptions{}); err != nil {
		t.Fatal(err)
	}
	restored := newID(t, rt)
	if _, err := rt.Restore(ctx, restored, copyRootfs(t, rootfs), img, RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if code, err := rt.Exec(ctx, restored, []string{"sh", "-c", "ls -A " + AgentStateDir + "; cat /dev/shm/x"}, nil, &out, nil); code != 0 || err != nil {
		t.Fatalf("look after the restore: exit %d, %v", code, err)
	}
	if out.String() != "x\n" {
		t.Fatalf("after the restore: %q, want the agent's tmpfs empty and the sandbox's /dev/shm file kept", out.String())
	}
}
