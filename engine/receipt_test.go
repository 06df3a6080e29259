package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/btrfs"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/btrfstest"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/overlay"
	"github.com/turnsnap/turnsnap/proc"
)

// These tests need root, overlayfs, runc, CRIU and busybox (requireProcs),
// and for btrfs a loop-mounted btrfs (btrfstest).

// independentDigest hashes the tree under root the test's own way, sharing
// no code with turnsnap: every path (sorted), its type and permission bits,
// a file's size and sha256, a symlink's target. Directory sizes and every
// mtime are left out (they are not state a restore promises).
func independentDigest(t testing.TB, root string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		line := fmt.Sprintf("%s\t%o", rel, uint32(fi.Mode()))
		switch {
		case fi.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			h := sha256.New()
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return err
			}
			line += fmt.Sprintf("\t%d\t%s", fi.Size(), hex.EncodeToString(h.Sum(nil)))
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			line += "\t" + target
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatalf("digest of %s: %v", root, err)
	}
	slices.Sort(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(sum[:])
}

// stepper is a long-lived process that keeps a counter in memory (a shell
// variable) and, each time the test drops /tmp/go into the root, adds one
// and writes it to disk: /data/count and a line of /data/log. It touches
// nothing between steps, so the root is still at a checkpoint.
const stepperScript = `n=0; while :; do if [ -e /tmp/go ]; then n=$((n+1)); echo $n >> /data/log; echo $n > /data/count.new; mv /data/count.new /data/count; rm /tmp/go; fi; usleep 20000; done`

// step makes the stepper take one step and waits (bounded) until it has:
// it returns the count it wrote, which the process kept in memory.
func step(t *testing.T, root string) int {
	t.Helper()
	before, _ := os.ReadFile(filepath.Join(root, "data/count"))
	must(t, os.WriteFile(filepath.Join(root, "tmp/go"), nil, 0o644))
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join(root, "data/count"))
		_, goErr := os.Stat(filepath.Join(root, "tmp/go"))
		if err == nil && string(b) != string(before) && errors.Is(goErr, fs.ErrNotExist) {
			n, err := strconv.Atoi(strings.TrimSpace(string(b)))
			must(t, err)
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stepper did not step within 20s (count %q)", b)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, not a guess
	}
}

func receiptSandbox(t *testing.T, e *Engine, name string, o CreateOptions) string {
	t.Helper()
	ctx := context.Background()
	base := busyboxBase(t)
	must(t, os.MkdirAll(filepath.Join(base, "data"), 0o755))
	o.Base = base
	r, err := e.CreateSandbox(ctx, delta.SandboxName(name), o)
	must(t, err)
	_, err = e.Processes().Exec(ctx, delta.SandboxName(name), []string{"sh", "-c", stepperScript}, ExecOptions{Detach: true})
	must(t, err)
	_, err = e.Processes().Exec(ctx, delta.SandboxName(name), []string{"httpd", "-f", "-p", "8080", "-h", "/www"}, ExecOptions{Detach: true})
	must(t, err)
	return r.Root
}

// TestReceiptTwentyGenerations: 20 generations of checkpoint, change,
// rollback, continue, with a process that keeps state in memory and on
// disk; at every generation the receipt and the test's own digest of the
// root agree that the root is the checkpoint's, and the receipt's process
// inventory is the image's (the process's memory came back: it goes on
// counting from the checkpoint's count).
func TestReceiptTwentyGenerations(t *testing.T) {
	requireProcs(t)
	t.Run("overlay", func(t *testing.T) { receiptGenerations(t, CreateOptions{Backend: overlay.Name}) })
	t.Run("btrfs", func(t *testing.T) {
		pool := btrfstest.Pool(t)
		receiptGenerations(t, CreateOptions{Backend: btrfs.Name, Btrfs: btrfs.Options{Pool: pool}})
	})
}

func receiptGenerations(t *testing.T, o CreateOptions) {
	ctx := context.Background()
	e := newEngine(t)
	root := receiptSandbox(t, e, "s", o)
	n := step(t, root)
	for gen := 1; gen <= 20; gen++ {
		c, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
		must(t, err)
		cp, err := e.resolveFor(ctx, "", mustRef(c.ID.String()))
		must(t, err)
		atCP := independentDigest(t, root)
		// The agent goes on: the process steps, a file is written and one
		// removed; then the turn is rolled back.
		if m := step(t, root); m != n+1 {
			t.Fatalf("gen %d: stepper at %d after %d", gen, m, n)
		}
		write(t, filepath.Join(root, fmt.Sprintf("data/junk-%d", gen)), "not in the checkpoint")
		must(t, os.Remove(filepath.Join(root, "www/index.html")))
		if independentDigest(t, root) == atCP {
			t.Fatalf("gen %d: the change did not change the digest", gen)
		}
		r, err := e.Rollback(ctx, "s", mustRef(cp.ID.String()), RollbackOptions{})
		must(t, err)
		rc := r.Receipt
		if rc == nil || !rc.OK || !rc.Files.Match || rc.Processes == nil || !rc.Processes.Match {
			t.Fatalf("gen %d: receipt %+v", gen, rc)
		}
		if rc.Files.Want != cp.FSTree || rc.Checkpoint != cp.ID || len(rc.NotRestored) == 0 {
			t.Fatalf("gen %d: receipt names %s/%s, checkpoint %s/%s", gen, rc.Checkpoint.Short(), rc.Files.Want.Short(), cp.ID.Short(), cp.FSTree.Short())
		}
		// The receipt's tree is the checkpoint's (or the same state with
		// the process restore's socket noise, of which this sandbox has
		// none: httpd listens on TCP).
		if rc.Files.Got != cp.FSTree && rc.Files.GotState != cp.StateKey {
			t.Fatalf("gen %d: receipt's tree %s, checkpoint's %s", gen, rc.Files.Got.Short(), cp.FSTree.Short())
		}
		if got := independentDigest(t, root); got != atCP {
			t.Fatalf("gen %d: the receipt says match, the independent digest differs", gen)
		}
		if !slices.ContainsFunc(rc.Processes.Got.Listening, func(l string) bool { return strings.HasSuffix(l, ":8080") }) || !slices.ContainsFunc(rc.Processes.Got.Procs, func(p proc.InventoryProc) bool { return p.Comm == "httpd" }) {
			t.Fatalf("gen %d: httpd not in the receipt's processes: %+v", gen, rc.Processes.Got)
		}
		// Continue: the restored process counts on from its memory.
		if m := step(t, root); m != n+1 {
			t.Fatalf("gen %d: after the rollback the stepper wrote %d, the checkpoint's count was %d", gen, m, n)
		}
		n++
	}
}

// TestReceiptFailsClosed: a difference the receipt finds (a file gone, a
// process gone) is restore_incomplete, never success, and the sandbox is
// left as the error says: its head the checkpoint, no process running.
// The daemon's engine (change tracking): its receipt scans the root
// through the tracker, which sees a file removed after the restore
// verified it (the CLI's trusts that verification and checks the mount:
// TestReceiptUnmountedRoot).
func TestReceiptFailsClosed(t *testing.T) {
	requireProcs(t)
	ctx := context.Background()
	e := openTracking(t, filepath.Join(t.TempDir(), "home"))
	root := receiptSandbox(t, e, "s", CreateOptions{})
	step(t, root)
	cp, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)

	t.Run("file", func(t *testing.T) {
		e.opts.AtPhase = func(ph string) {
			if ph == PhaseReceiptFiles {
				os.Remove(filepath.Join(root, "www/index.html"))
			}
		}
		defer func() { e.opts.AtPhase = nil }()
		r, err := e.Rollback(ctx, "s", mustRef(cp.ID.String()), RollbackOptions{})
		checkIncomplete(t, e, r, err)
		if ri := asIncomplete(t, err); ri.Receipt.Files.Match || !strings.Contains(ri.Receipt.Files.Mismatch, "www/index.html") {
			t.Fatalf("files receipt %+v", ri.Receipt.Files)
		}
	})
	t.Run("process", func(t *testing.T) {
		e.opts.AtPhase = func(ph string) {
			if ph != PhaseReceiptProcesses {
				return
			}
			rt, err := e.procs.Runtime(ctx)
			must(t, err)
			set, err := rt.Snapshot(ctx, e.procs.ContainerID("s"))
			must(t, err)
			for _, p := range set.Procs {
				if p.Comm == "httpd" {
					must(t, syscall.Kill(p.HostPID, syscall.SIGKILL))
					waitGone(t, p.HostPID)
				}
			}
		}
		defer func() { e.opts.AtPhase = nil }()
		r, err := e.Rollback(ctx, "s", mustRef(cp.ID.String()), RollbackOptions{})
		checkIncomplete(t, e, r, err)
		ri := asIncomplete(t, err)
		if !ri.Receipt.Files.Match || ri.Receipt.Processes == nil || ri.Receipt.Processes.Match ||
			!slices.ContainsFunc(ri.Receipt.Processes.Missing, func(s string) bool { return strings.Contains(s, "httpd") }) ||
			!slices.ContainsFunc(ri.Receipt.Processes.Missing, func(s string) bool { return strings.HasSuffix(s, ":8080 not listening") }) {
			t.Fatalf("process receipt %+v", ri.Receipt.Processes)
		}
	})
	// Nothing changed since: a plain rollback proves itself again.
	r, err := e.Rollback(ctx, "s", mustRef(cp.ID.String()), RollbackOptions{})
	must(t, err)
	if !r.Receipt.OK {
		t.Fatalf("receipt after the failures: %+v", r.Receipt)
	}
}

func asIncomplete(t *testing.T, err error) *RestoreIncompleteError {
	t.Helper()
	var ri *RestoreIncompleteError
	if !errors.As(err, &ri) {
		t.Fatalf("error %v is not a RestoreIncompleteError", err)
	}
	return ri
}

// checkIncomplete: the restore failed as restore_incomplete with its
// receipt, and left the sandbox as the error says.
func checkIncomplete(t *testing.T, e *Engine, r *RestoreResult, err error) {
	t.Helper()
	if !errors.Is(err, errdefs.ErrRestoreIncomplete) {
		t.Fatalf("rollback: %v, want restore_incomplete", err)
	}
	ri := asIncomplete(t, err)
	if r == nil || r.Receipt != ri.Receipt || ri.Receipt.OK {
		t.Fatalf("result %+v, error's receipt %+v", r, ri.Receipt)
	}
	if !strings.Contains(err.Error(), "no process running") {
		t.Fatalf("error does not name the state left: %v", err)
	}
	running, cerr := e.procs.Running(context.Background(), e.procs.Container("s"))
	must(t, cerr)
	if running {
		t.Fatal("processes still run after restore_incomplete")
	}
	st, lerr := e.loadSandbox(context.Background(), "s")
	must(t, lerr)
	if st.head.ID != ri.Receipt.Checkpoint {
		t.Fatalf("head %s, the error says %s", st.head.ID.Short(), ri.Receipt.Checkpoint.Short())
	}
}

// waitGone waits (bounded) until host pid is gone or a zombie.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(b), ") Z ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still alive", pid)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition
	}
}

// TestReceiptTrackedSeesAWrite: with the daemon's change tracker the
// receipt's scan reads only what was written since the restore verified
// its state, and still sees a file written or removed after it: a
// rollback whose root changes at the receipt is restore_incomplete, and
// one whose root does not proves itself through the tracker.
func TestReceiptTrackedSeesAWrite(t *testing.T) {
	ctx := context.Background()
	e := openTracking(t, filepath.Join(t.TempDir(), "home"))
	cr := smallSandbox(t, e, "s")
	for i := range 50 {
		write(t, filepath.Join(cr.Root, fmt.Sprintf("src/f%02d.go", i)), fmt.Sprintf("package f // %d\n", i))
	}
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	write(t, filepath.Join(cr.Root, "src/f07.go"), "package f // turn 2\n")
	c2, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	r, err := e.Rollback(ctx, "s", mustRef(c1.ID.String()), RollbackOptions{})
	must(t, err)
	if !r.Receipt.OK || r.LiveScan != overlay.LiveTracked {
		t.Fatalf("tracked rollback: live scan %q, receipt %+v", r.LiveScan, r.Receipt)
	}
	for _, tamper := range []func(){
		func() { must(t, os.Remove(filepath.Join(cr.Root, "src/f11.go"))) },
		func() { write(t, filepath.Join(cr.Root, "src/f12.go"), "package f // 1X\n") }, // same size
	} {
		e.opts.AtPhase = func(ph string) {
			if ph == PhaseReceiptFiles {
				tamper()
			}
		}
		_, err := e.Rollback(ctx, "s", mustRef(c2.ID.String()), RollbackOptions{})
		e.opts.AtPhase = nil
		ri := asIncomplete(t, err)
		if ri.Receipt.Files.Match || ri.Receipt.Files.Mismatch == "" {
			t.Fatalf("tampered root's receipt %+v", ri.Receipt.Files)
		}
		// Back to a state the store has, by a rollback that proves itself.
		r, err := e.Rollback(ctx, "s", mustRef(c1.ID.String()), RollbackOptions{})
		must(t, err)
		if !r.Receipt.OK {
			t.Fatalf("receipt %+v", r.Receipt)
		}
	}
}

// TestReceiptUnmountedRoot: the CLI's receipt builds on what the restore
// verified and checks that the root the sandbox sees is the mount of it;
// a root left unmounted (an empty directory: every file missing) is
// restore_incomplete, on overlay and btrfs.
func TestReceiptUnmountedRoot(t *testing.T) {
	for _, backend := range []string{overlay.Name, btrfs.Name} {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			e := newEngine(t)
			base := t.TempDir()
			write(t, filepath.Join(base, "a.txt"), "base\n")
			o := CreateOptions{Base: base}
			if backend == btrfs.Name {
				o = btrfsOpts(btrfstest.Pool(t), base)
			}
			cr, err := e.CreateSandbox(ctx, "s", o)
			must(t, err)
			write(t, filepath.Join(cr.Root, "b.txt"), "turn 1\n")
			c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
			must(t, err)
			write(t, filepath.Join(cr.Root, "b.txt"), "turn 2\n")
			_, err = e.Checkpoint(ctx, "s", CheckpointOptions{})
			must(t, err)
			e.opts.AtPhase = func(ph string) {
				if ph == PhaseReceiptFiles {
					must(t, syscall.Unmount(cr.Root, syscall.MNT_DETACH))
				}
			}
			r, err := e.Rollback(ctx, "s", mustRef(c1.ID.String()), RollbackOptions{})
			e.opts.AtPhase = nil
			checkIncomplete(t, e, r, err)
			if m := asIncomplete(t, err).Receipt.Files.Mismatch; !strings.Contains(m, "not") {
				t.Fatalf("mismatch %q", m)
			}
			// A rollback mounts the root again and proves itself.
			r, err = e.Rollback(ctx, "s", mustRef(c1.ID.String()), RollbackOptions{})
			must(t, err)
			if !r.Receipt.OK || r.Receipt.Files.Got != r.Receipt.Files.Want && r.Receipt.Files.Noise == "" {
				t.Fatalf("receipt %+v", r.Receipt)
			}
			if b, err := os.ReadFile(filepath.Join(cr.Root, "b.txt")); err != nil || string(b) != "turn 1\n" {
				t.Fatalf("b.txt after the rollback: %q %v", b, err)
			}
		})
	}
}
