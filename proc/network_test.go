package proc

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// TestEstablishedTCPSurvivesRestore: a client holding a loopback connection
// to a server inside the sandbox (a dev server and its database) is dumped
// mid-conversation; in the restored container the same connection carries
// the rest of it.
func TestEstablishedTCPSurvivesRestore(t *testing.T) {
	rt := newRuntime(t)
	ctx := testCtx(t)
	rootfs := busyboxRootfs(t)
	id := startKeeper(t, rt, rootfs)
	// Inputs that never end keep both ends of the connection open.
	if _, err := rt.ExecDetached(ctx, id, []string{"sh", "-c", "sleep 1000 | nc -l -p 9000 > /tmp/recv"}, DetachOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the server to listen", func() bool {
		code, err := rt.Exec(ctx, id, []string{"sh", "-c", "netstat -tln | grep -q :9000"}, nil, nil, nil)
		return err == nil && code == 0
	})
	if _, err := rt.ExecDetached(ctx, id, []string{"sh", "-c", "(echo one; sleep 2; echo two; sleep 1000) | nc 127.0.0.1 9000"}, DetachOptions{}); err != nil {
		t.Fatal(err)
	}
	recv := filepath.Join(rootfs, "tmp", "recv")
	waitFor(t, 5*time.Second, "the first line", func() bool { b, _ := os.ReadFile(recv); return string(b) == "one\n" })

	img := filepath.Join(t.TempDir(), "img")
	if _, err := rt.Checkpoint(ctx, id, img, DumpOptions{}); err != nil {
		t.Fatal(err)
	}
	rfs := copyRootfs(t, rootfs)
	rid := newID(t, rt)
	if _, err := rt.Restore(ctx, rid, rfs, img, RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{recv, filepath.Join(rfs, "tmp", "recv")} {
		waitFor(t, 10*time.Second, "the second line in "+f, func() bool { b, _ := os.ReadFile(f); return string(b) == "one\ntwo\n" })
	}
}

// TestDumpAndStop: DumpOptions.Stop leaves no container, and the image
// restores under the same id: a rollback in place.
func TestDumpAndStop(t *testing.T) {
	rt := newRuntime(t)
	ctx := testCtx(t)
	rootfs := busyboxRootfs(t)
	id := startKeeper(t, rt, rootfs)
	if _, err := rt.ExecDetached(ctx, id, counterLoop, DetachOptions{}); err != nil {
		t.Fatal(err)
	}
	counter := filepath.Join(rootfs, "tmp", "counter")
	waitFor(t, 10*time.Second, "the counter to reach 10", func() bool { v, _ := readInt(counter); return v >= 10 })
	img := filepath.Join(t.TempDir(), "img")
	if _, err := rt.Checkpoint(ctx, id, img, DumpOptions{Stop: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.State(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("State after a stopping dump: %v, want ErrNotFound", err)
	}
	if _, err := rt.Exec(ctx, id, []string{"true"}, nil, nil, nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Exec after a stopping dump: %v, want ErrNotFound", err)
	}
	v, _ := readInt(counter)
	time.Sleep(200 * time.Millisecond)
	if n, _ := readInt(counter); n != v {
		t.Fatalf("counter moved from %d to %d after a stopping dump", v, n)
	}
	if _, err := rt.Restore(ctx, id, rootfs, img, RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the counter to go on", func() bool { n, _ := readInt(counter); return n > v+3 })
	if _, err := rt.Restore(ctx, id, rootfs, img, RestoreOptions{}); !errors.Is(err, errdefs.ErrExists) || !strings.Contains(err.Error(), id) {
		t.Errorf("restore onto a taken id: %v, want ErrExists", err)
	}
}
