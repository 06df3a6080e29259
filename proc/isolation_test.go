package proc

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// assertPrivate fails unless every directory under dir (dir included) is
// 0700 and every file has no group or other permission; it returns the
// number of regular files.
func assertPrivate(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Errorf("walk %s: %v", p, err)
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			t.Errorf("%s: %v", p, err)
			return nil
		}
		switch {
		case d.IsDir() && fi.Mode().Perm() != 0o700:
			t.Errorf("directory %s is %v, want 0700", p, fi.Mode().Perm())
		case d.Type().IsRegular():
			n++
			if fi.Mode().Perm()&0o077 != 0 {
				t.Errorf("file %s is %v: group or others can read it", p, fi.Mode().Perm())
			}
		}
		return nil
	})
	return n
}

// inContainer runs a shell script in container id and returns its output.
func inContainer(t *testing.T, rt *Runtime, id, script string) string {
	t.Helper()
	var out, errb bytes.Buffer
	code, err := rt.Exec(testCtx(t), id, []string{"sh", "-c", script}, nil, &out, &errb)
	if err != nil || code != 0 {
		t.Fatalf("exec %q in %s: %d, %v: %s", script, id, code, err, errb.String())
	}
	return strings.TrimSpace(out.String())
}

// checkNamespaces: the container's init has its own pid, mount, network,
// ipc, uts and cgroup namespaces, sees only loopback and no cgroup path of
// the host (a cgroup namespace rooted at its own cgroup), and runs under
// the seccomp filter.
func checkNamespaces(t *testing.T, rt *Runtime, id string) {
	t.Helper()
	st, err := rt.State(testCtx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"pid", "mnt", "net", "ipc", "uts", "cgroup"} {
		// This thread's, not /proc/self's: that is the main thread's.
		host, err1 := os.Readlink("/proc/thread-self/ns/" + ns)
		theirs, err2 := os.Readlink(filepath.Join("/proc", strconv.Itoa(st.InitPID), "ns", ns))
		if err1 != nil || err2 != nil || host == theirs {
			t.Errorf("container %s: %s namespace %q, the host's %q (%v, %v)", id, ns, theirs, host, err1, err2)
		}
	}
	// The host sees the container's cgroup path; the container sees "/".
	hostView, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(st.InitPID), "cgroup"))
	if err != nil || !strings.Contains(string(hostView), rt.cgroupsPath(id)) {
		t.Fatalf("the host does not see container %s in %s: %q, %v", id, rt.cgroupsPath(id), hostView, err)
	}
	for _, l := range strings.Split(inContainer(t, rt, id, "cat /proc/1/cgroup /proc/self/cgroup"), "\n") {
		if !strings.HasSuffix(l, ":/") {
			t.Errorf("container %s sees cgroup %q", id, l)
		}
	}
	if got := inContainer(t, rt, id, "ls /sys/class/net"); got != "lo" {
		t.Errorf("container %s has interfaces %q, want only lo", id, got)
	}
	// The seccomp filter (seccomp.go) holds for the init (restored by
	// CRIU after a restore) and for every command: a user namespace,
	// which needs no capability, is refused.
	if got := inContainer(t, rt, id, "grep Seccomp: /proc/1/status /proc/self/status | tr -s '\t ' ' '"); got != "/proc/1/status:Seccomp: 2\n/proc/self/status:Seccomp: 2" {
		t.Errorf("container %s: seccomp modes %q, want filter mode (2) for init and command", id, got)
	}
	if got := inContainer(t, rt, id, "unshare -U true 2>&1 && echo made || echo refused"); !strings.HasSuffix(got, "refused") {
		t.Errorf("container %s made a user namespace: %q", id, got)
	}
}

// TestContainerNamespacesSurviveRestore: the namespaces are the
// container's own when it starts and again when CRIU restores it.
func TestContainerNamespacesSurviveRestore(t *testing.T) {
	rt := newRuntime(t)
	ctx := testCtx(t)
	rootfs := busyboxRootfs(t)
	id := startKeeper(t, rt, rootfs)
	checkNamespaces(t, rt, id)
	img := filepath.Join(t.TempDir(), "img")
	if _, err := rt.Checkpoint(ctx, id, img, DumpOptions{}); err != nil {
		t.Fatal(err)
	}
	rid := newID(t, rt)
	if _, err := rt.Restore(ctx, rid, copyRootfs(t, rootfs), img, RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	checkNamespaces(t, rt, rid)
}

// TestImagesAndWorkDirsArePrivate: a dump's image files are 0600 in a 0700
// directory (CRIU makes them 0644), the work directories are gone after a
// dump and a restore, and failed restores keep only the newest failedKeep
// work directories, private, each named by its error.
func TestImagesAndWorkDirsArePrivate(t *testing.T) {
	rt := newRuntime(t)
	ctx := testCtx(t)
	rootfs := busyboxRootfs(t)
	id := startKeeper(t, rt, rootfs)
	img := filepath.Join(t.TempDir(), "img")
	if _, err := rt.Checkpoint(ctx, id, img, DumpOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := assertPrivate(t, img); n < 10 {
		t.Fatalf("only %d files in the image", n)
	}
	rid := newID(t, rt)
	if _, err := rt.Restore(ctx, rid, copyRootfs(t, rootfs), img, RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	work := workRoot(rt.cfg.StateRoot)
	ents, _ := os.ReadDir(work)
	for _, e := range ents {
		if e.Name() != "failed" {
			t.Errorf("work dir %s left after a dump and a restore", e.Name())
		}
	}

	// A broken image: CRIU refuses it, and the work dir is kept.
	bad := filepath.Join(t.TempDir(), "bad")
	if out, err := exec.Command("cp", "-a", img, bad).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	if err := os.Remove(filepath.Join(bad, "inventory.img")); err != nil {
		t.Fatal(err)
	}
	var kept []string
	for range failedKeep + 2 {
		_, err := rt.Restore(ctx, newID(t, rt), copyRootfs(t, rootfs), bad, RestoreOptions{})
		if err == nil {
			t.Fatal("a restore without inventory.img succeeded")
		}
		_, after, ok := strings.Cut(err.Error(), "(work dir ")
		dir, _, _ := strings.Cut(after, " kept)")
		if !ok || filepath.Dir(dir) != failedRoot(rt.cfg.StateRoot) {
			t.Fatalf("the error does not name a kept work dir under %s: %v", failedRoot(rt.cfg.StateRoot), err)
		}
		kept = append(kept, dir)
	}
	left, err := os.ReadDir(failedRoot(rt.cfg.StateRoot))
	if err != nil || len(left) != failedKeep {
		t.Fatalf("%d failed work dirs kept (%v), want %d", len(left), err, failedKeep)
	}
	for i, d := range kept {
		_, err := os.Stat(filepath.Join(d, "restore.log"))
		if newest := i >= len(kept)-failedKeep; newest != (err == nil) {
			t.Errorf("failed work dir %d of %d (%s): kept %v, want %v", i+1, len(kept), d, err == nil, newest)
		}
	}
	assertPrivate(t, failedRoot(rt.cfg.StateRoot))
}
