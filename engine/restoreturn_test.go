package engine

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/btrfstest"

	"github.com/turnsnap/turnsnap/delta"
)

// holderSource binds a unix socket in the sandbox root and holds a file it
// has deleted, then sleeps: the two things whose restore by CRIU touches
// the restored tree (the socket node is bound anew, the deleted file comes
// back as a "ghost" that CRIU creates and unlinks again).
const holderSource = `package main

import (
	"net"
	"os"
	"time"
)

func main() {
	if _, err := net.Listen("unix", "/tmp/holder.sock"); err != nil {
		panic(err)
	}
	f, err := os.Create("/tmp/ghost")
	if err != nil {
		panic(err)
	}
	f.WriteString("deleted while open\n")
	os.Remove("/tmp/ghost")
	os.WriteFile("/tmp/holder.ready", []byte("1"), 0o644)
	for {
		time.Sleep(time.Hour)
	}
}
`

// holderBase is busyboxBase plus /bin/holder, built static from
// holderSource.
func holderBase(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "main.go"), []byte(holderSource), 0o644))
	must(t, os.WriteFile(filepath.Join(src, "go.mod"), []byte("module holder\n\ngo 1.22\n"), 0o644))
	base := busyboxBase(t)
	cmd := exec.Command("go", "build", "-o", filepath.Join(base, "bin/holder"), ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build holder: %v\n%s", err, out)
	}
	return base
}

// The turn after a rollback that restored processes holding a bound unix
// socket and a deleted-open file reflects only what the agent did: idle,
// it is a skip; writing one file, it is an fs turn that reads that file.
// Both backends.
func TestTurnAfterProcessRestoreIsTheAgents(t *testing.T) {
	requireProcs(t)
	base := holderBase(t)
	t.Run("overlay", func(t *testing.T) { turnAfterProcessRestore(t, CreateOptions{Base: base}) })
	t.Run("btrfs", func(t *testing.T) { turnAfterProcessRestore(t, btrfsOpts(btrfstest.Pool(t), base)) })
}

func turnAfterProcessRestore(t *testing.T, opts CreateOptions) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "h", opts)
	must(t, err)
	_, err = e.Processes().Exec(ctx, "h", []string{"/bin/holder"}, ExecOptions{Detach: true})
	must(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(cr.Root, "tmp/holder.ready")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("holder did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	settle()
	c1, err := e.Checkpoint(ctx, "h", CheckpointOptions{})
	must(t, err)
	if c1.Class != delta.ClassFull {
		t.Fatalf("the turn that started the holder classed %s", c1.Class)
	}
	write(t, filepath.Join(cr.Root, "later.txt"), "a later turn\n")
	_, err = e.Checkpoint(ctx, "h", CheckpointOptions{})
	must(t, err)
	r, err := e.Rollback(ctx, "h", mustRef(c1.ID.String()), RollbackOptions{})
	must(t, err)
	if !r.Processes {
		t.Fatal("the rollback did not restore the holder")
	}
	settle()
	idle, err := e.Checkpoint(ctx, "h", CheckpointOptions{})
	must(t, err)
	if idle.Class != delta.ClassSkip {
		if d, err := e.History().Diff(ctx, "h", mustRef(c1.ID.String()), mustRef(idle.ID.String())); err == nil {
			t.Logf("diff: %+v", d)
		}
		t.Fatalf("an idle turn after the restore classed %s (%s), read %d files", idle.Class, idle.ProcessChange, idle.Stats.FilesRead)
	}
	write(t, filepath.Join(cr.Root, "one.txt"), "the agent's one file\n")
	one, err := e.Checkpoint(ctx, "h", CheckpointOptions{})
	must(t, err)
	if one.Class != delta.ClassFS || one.Stats.FilesRead != 1 {
		t.Fatalf("a one-file turn after the restore classed %s (%s), read %d files", one.Class, one.ProcessChange, one.Stats.FilesRead)
	}
}
