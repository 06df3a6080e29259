package engine

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/moby/sys/mountinfo"
	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// TestKilledRollbackHelper is the process TestKilledRollbackKeepsRootAndHead
// kills: with its environment set, it rolls back and SIGKILLs itself at the
// named phase.
func TestKilledRollbackHelper(t *testing.T) {
	home, phase, target := os.Getenv("TS_KILL_HOME"), os.Getenv("TS_KILL_PHASE"), os.Getenv("TS_KILL_TARGET")
	if home == "" {
		t.Skip("helper process only")
	}
	e, err := Open(context.Background(), Options{Home: home})
	must(t, err)
	e.opts.AtPhase = func(p string) {
		if p == phase {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	}
	e.Rollback(context.Background(), "s", mustRef(target), RollbackOptions{})
	t.Fatal("not killed")
}

// A rollback SIGKILLed at each phase leaves root and head agreeing once the
// sandbox is next used, and the root mounted. "rollback: layer-rewrite"
// kills it after the first of the diff's changes (overlay/restore.go): the
// next use finds the intent and finishes the rollback from the mixed
// layer, by diff again, so one.txt, rewritten in place, keeps its inode
// throughout. Each phase runs three times: with a diff of names the base
// lacks, written through the mounted root (fstree.DiffPlan.Mountable);
// with one that also brings an edited base file back, written through the
// mount as a copy of the base's (fstree's diffbase.go); and with one that
// brings back a base file a directory had replaced, written to the
// unmounted upper.
func TestKilledRollbackKeepsRootAndHead(t *testing.T) {
	for _, phase := range []string{"rollback: intent written", "rollback: layer-rewrite", "rollback: root switched", "rollback: head moved"} {
		for _, how := range []string{"mounted", "base-copy", "unmounted"} {
			t.Run(phase+"/"+how, func(t *testing.T) {
				killedRollback(t, phase, how)
			})
		}
	}
}

func killedRollback(t *testing.T, phase, how string) {
	ctx := context.Background()
	home := filepath.Join(t.TempDir(), "home")
	e := openEngine(t, home)
	cr, c1 := firstTurn(t, e)
	state1 := mergedState(t, cr.Root)
	write(t, filepath.Join(cr.Root, "two.txt"), "turn 2\n")
	write(t, filepath.Join(cr.Root, "three.txt"), "turn 2\n")
	rewrite(t, filepath.Join(cr.Root, "one.txt"), "turn 2 rewrote it\n")
	switch how {
	case "base-copy":
		write(t, filepath.Join(cr.Root, "a.txt"), "copied up\n") // rollback writes the base's back
	case "unmounted":
		must(t, os.Remove(filepath.Join(cr.Root, "a.txt")))
		write(t, filepath.Join(cr.Root, "a.txt", "x"), "a directory over a base file\n")
	}
	_, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	state2 := mergedState(t, cr.Root)
	ino := inode(t, filepath.Join(cr.Root, "one.txt"))
	must(t, e.Close())

	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledRollbackHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TS_KILL_HOME="+home, "TS_KILL_PHASE="+phase, "TS_KILL_TARGET="+c1.ID.String())
	out, err := cmd.CombinedOutput()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("helper was not killed at %q: %v\n%s", phase, err, out)
	}

	e = openEngine(t, home)
	root, err := e.SandboxPath(ctx, "s") // the next use of the sandbox
	must(t, err)
	var head delta.ID
	must(t, e.view(ctx, func(tx *catalog.Tx) (err error) { head, err = tx.GetRef(delta.RefHead, "s"); return err }))
	if ok, _ := mountinfo.Mounted(root); !ok {
		t.Fatal("root not mounted after the killed rollback")
	}
	got := mergedState(t, root)
	switch {
	case head == c1.ID && got == state1:
	case head != c1.ID && got == state2:
	default:
		t.Fatalf("after a kill at %q: head is c1: %v, root is state1: %v, state2: %v", phase, head == c1.ID, got == state1, got == state2)
	}
	st, err := e.viewSandbox(ctx, "s")
	must(t, err)
	if _, ok := e.intents().Pending(st.sb); ok {
		t.Fatal("the intent outlived its rollback")
	}
	if got := inode(t, filepath.Join(root, "one.txt")); got != ino {
		t.Fatalf("one.txt has inode %d after the killed rollback, had %d", got, ino)
	}

}

// firstTurn makes sandbox s on a base holding a.txt and checkpoints its
// first turn, which writes one.txt.
func firstTurn(t *testing.T, e *Engine) (*CreateResult, *CheckpointResult) {
	t.Helper()
	ctx := context.Background()
	base := t.TempDir()
	write(t, filepath.Join(base, "a.txt"), "base\n")
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: base})
	must(t, err)
	write(t, filepath.Join(cr.Root, "one.txt"), "turn 1\n")
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	return cr, c1
}

// rewrite replaces a file's content in place (same inode).
func rewrite(t testing.TB, p, content string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	must(t, err)
	_, err = f.WriteString(content)
	must(t, err)
	must(t, f.Close())
}

func inode(t testing.TB, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	must(t, syscall.Lstat(p, &st))
	return st.Ino
}

// TestFailedRollbackKeepsHeadObject: a rollback that fails before it
// changes the root (here its unmount, refused while a file is open there)
// leaves the head's ref object, written beside the rewrite once the intent
// was durable, naming the head again, with the catalog's head and no
// intent; once the file is closed the rollback goes through.
func TestFailedRollbackKeepsHeadObject(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, c1 := firstTurn(t, e)
	// A directory over a base file: bringing the file back unmounts.
	must(t, os.Remove(filepath.Join(cr.Root, "a.txt")))
	write(t, filepath.Join(cr.Root, "a.txt", "x"), "a directory\n")
	c2, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	headObject := func() delta.ID {
		t.Helper()
		st, err := e.loadSandbox(ctx, "s")
		must(t, err)
		data, err := upload.ReadAll(ctx, e.stores.local, delta.HeadObject(st.sb.Key()))
		must(t, err)
		id, err := delta.ParseRef(data)
		must(t, err)
		return id
	}
	f, err := os.Open(filepath.Join(cr.Root, "one.txt"))
	must(t, err)
	wrote := false
	e.opts.AtPhase = func(p string) { wrote = wrote || p == "rollback: intent written" }
	_, err = e.Rollback(ctx, "s", mustRef(c1.ID.String()), RollbackOptions{})
	if !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("rollback of a busy root: %v", err)
	}
	if !wrote {
		t.Fatal("the rollback failed before its first write: the test proves nothing")
	}
	var head delta.ID
	must(t, e.view(ctx, func(tx *catalog.Tx) (err error) { head, err = tx.GetRef(delta.RefHead, "s"); return err }))
	if got := headObject(); head != c2.ID || got != c2.ID {
		t.Fatalf("after a failed rollback the head is %s in the catalog and %s in its object, want %s", head.Short(), got.Short(), c2.ID.Short())
	}
	if st, err := e.viewSandbox(ctx, "s"); err != nil || st.interrupted != nil {
		t.Fatalf("a failed rollback left its intent: %v, %v", st.interrupted, err)
	}
	must(t, f.Close())
	_, err = e.Rollback(ctx, "s", mustRef(c1.ID.String()), RollbackOptions{})
	must(t, err)
	if got := headObject(); got != c1.ID {
		t.Fatalf("after the rollback the head object names %s, want %s", got.Short(), c1.ID.Short())
	}
}
