package proc

// Tests in this package that start containers need root, runc (Debian's
// runc package), CRIU (scripts/criu-install.sh puts it under
// $TURNSNAP_CACHE/criu) and /bin/busybox (busybox-static) for the test
// rootfs; `make test` installs all of them (scripts/deps.d/30-proc.sh).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/turnsnap/turnsnap/internal/testenv"
)

// Every test run has its own state root, /run/turnsnap-proc-test/PID, so
// runs in parallel (other worktrees, other packages) never touch each
// other's containers; cgroup paths carry the state root's identity too
// (Runtime.cgroupsPath). TestMain sweeps the roots of runs that died.
const testStateParent = "/run/turnsnap-proc-test"

func testStateRoot() string { return filepath.Join(testStateParent, strconv.Itoa(os.Getpid())) }

func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		dirs, _ := os.ReadDir(testStateParent)
		for _, d := range dirs {
			pid, err := strconv.Atoi(d.Name())
			if err != nil || pid == os.Getpid() || unix.Kill(pid, 0) != nil {
				sweep(filepath.Join(testStateParent, d.Name()))
			}
		}
	}
	code := m.Run()
	sweep(testStateRoot())
	os.Exit(code)
}

// sweep force-deletes every container under a test state root, and the root.
func sweep(stateRoot string) {
	if os.Geteuid() != 0 {
		return
	}
	root := filepath.Join(stateRoot, "runc")
	if out, err := exec.Command("runc", "--root", root, "list", "-q").Output(); err == nil {
		for _, id := range strings.Fields(string(out)) {
			_ = exec.Command("runc", "--root", root, "delete", "-f", id).Run()
		}
	}
	pinned, _ := filepath.Glob(filepath.Join(netnsDir(stateRoot), "*"))
	for _, p := range pinned {
		_ = removeNetns(p)
	}
	os.RemoveAll(stateRoot)
}

// needParts stops t unless root, runc, CRIU and busybox are all present.
func needParts(t testing.TB) {
	t.Helper()
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("runc"); err != nil {
		testenv.Missing(t, "runc", "sandboxes run under runc (Debian package runc)")
	}
	if _, err := os.Stat(DefaultCRIUPath()); err != nil {
		testenv.Missing(t, "CRIU", "scripts/criu-install.sh installs it at "+DefaultCRIUPath())
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		testenv.Missing(t, "busybox", "the test rootfs is busybox-static's /bin/busybox")
	}
}

// newRuntime returns a Runtime over the test state root.
func newRuntime(t testing.TB) *Runtime {
	t.Helper()
	needParts(t)
	rt, err := New(context.Background(), Config{StateRoot: testStateRoot()})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// busyboxRootfs lays out a minimal sandbox root in a temp dir: busybox, a
// symlink per applet, and the directories a container mounts over.
func busyboxRootfs(t testing.TB) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rootfs")
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp", "root", "www"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), bb, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// copyRootfs copies a rootfs for a restore (a branch gets its own root).
func copyRootfs(t testing.TB, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "rootfs")
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	return dst
}

var idSeq atomic.Int64

// newID returns a container id unique in this test run, and deletes that
// container when the test ends, whatever happened to it.
func newID(t testing.TB, rt *Runtime) string {
	t.Helper()
	id := fmt.Sprintf("ts-%d-%d", os.Getpid(), idSeq.Add(1))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rt.Delete(ctx, id); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return id
}

// startKeeper starts a container with the default keeper init on rootfs.
func startKeeper(t testing.TB, rt *Runtime, rootfs string) string {
	t.Helper()
	id := newID(t, rt)
	if err := rt.Start(testCtx(t), id, rootfs, StartOptions{}); err != nil {
		t.Fatal(err)
	}
	return id
}

// testCtx bounds every call of a test: nothing here should take a minute.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond every 20 ms until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readInt reads a file holding one decimal number; ok is false while the
// file is missing or half written.
func readInt(path string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return n, err == nil
}
