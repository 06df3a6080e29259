package proc

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func TestNewProbesTools(t *testing.T) {
	rt := newRuntime(t)
	if rt.RuncVersion() == "" {
		t.Error("no runc version")
	}
	if rt.CRIUVersion() < 40200 {
		t.Errorf("CRIU %s: want >= 4.2 (4.1 cannot dump TCP sockets on kernels >= 6.16)", rt.CRIUVersion())
	}
	h := rt.Host()
	if h.Kernel == "" || h.Arch == "" || len(h.CPUFlags) == 0 || h.CRIUVersion != rt.CRIUVersion() {
		t.Errorf("host facts incomplete: %+v", h)
	}
	t.Logf("runc %s, CRIU %s, features %+v, kernel %s, %d CPU flags",
		rt.RuncVersion(), rt.CRIUVersion(), rt.Features(), h.Kernel, len(h.CPUFlags))

	_, err := New(testCtx(t), Config{StateRoot: t.TempDir(), CRIU: "/nonexistent/criu"})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("New with a missing CRIU: %v, want ErrUnavailable", err)
	}
}

func TestExecStreamsAndExitCodes(t *testing.T) {
	rt := newRuntime(t)
	ctx := testCtx(t)
	id := startKeeper(t, rt, busyboxRootfs(t))

	var out, errOut bytes.Buffer
	code, err := rt.Exec(ctx, id, []string{"sh", "-c", "cat; echo oops >&2; exit 3"},
		strings.NewReader("hello from stdin\n"), &out, &errOut)
	if err != nil || code != 3 {
		t.Fatalf("exec: code %d, err %v", code, err)
	}
	if out.String() != "hello from stdin\n" || errOut.String() != "oops\n" {
		t.Errorf("stdout %q, stderr %q", out.String(), errOut.String())
	}

	out.Reset()
	if code, err := rt.Exec(ctx, id, []string{"sh", "-c", "hostname; echo $HOME; pwd"}, nil, &out, nil); err != nil || code != 0 || out.String() != "sandbox\n/root\n/\n" {
		t.Errorf("hostname, HOME, cwd: %q code %d err %v", out.String(), code, err)
	}
	// Only loopback: the sandbox's network is its own.
	out.Reset()
	if _, err := rt.Exec(ctx, id, []string{"ls", "/sys/class/net"}, nil, &out, nil); err != nil || strings.TrimSpace(out.String()) != "lo" {
		t.Errorf("interfaces: %q err %v", out.String(), err)
	}

	// Passing a host file must not hand it to the container.
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if code, err := rt.Exec(ctx, id, []string{"readlink", "/proc/self/fd/1"}, nil, f, nil); err != nil || code != 0 {
		t.Fatalf("readlink: code %d err %v", code, err)
	}
	if b, _ := os.ReadFile(f.Name()); !strings.HasPrefix(string(b), "pipe:") {
		t.Errorf("command's stdout is %q, want a pipe", b)
	}

	// Input that never ends (`sleep 30 | turnsnap exec s -- echo hi`, a
	// client that keeps its request body open) must not hold Exec once the
	// command has exited; and a host file as stdin is a pipe inside too.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pw.Close()
	defer pr.Close()
	done := make(chan error, 1)
	out.Reset()
	go func() {
		_, err := rt.Exec(ctx, id, []string{"readlink", "/proc/self/fd/0"}, pr, &out, nil)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil || !strings.HasPrefix(out.String(), "pipe:") {
			t.Errorf("exec with open stdin: %v, its stdin %q, want a pipe", err, out.String())
		}
	case <-time.After(execGrace + 20*time.Second):
		t.Fatal("exec whose stdin never ends did not return after the command exited")
	}

	if _, err := rt.Exec(ctx, id, []string{"/no/such/program"}, nil, nil, nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing program: %v, want ErrNotFound", err)
	}
	if _, err := rt.Exec(ctx, "ts-nosuch", []string{"true"}, nil, nil, nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing container: %v, want ErrNotFound", err)
	}
	if _, err := rt.Exec(ctx, "../x", []string{"true"}, nil, nil, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("bad id: %v, want ErrInvalid", err)
	}
}

func TestStartDeleteAndPause(t *testing.T) {
	rt := newRuntime(t)
	ctx := testCtx(t)
	rootfs := busyboxRootfs(t)
	id := startKeeper(t, rt, rootfs)
	if err := rt.Start(ctx, id, rootfs, StartOptions{}); !errors.Is(err, errdefs.ErrExists) {
		t.Errorf("second Start: %v, want ErrExists", err)
	}
	st, err := rt.State(ctx, id)
	if err != nil || st.Status != Running || st.InitPID == 0 {
		t.Fatalf("state %+v, err %v", st, err)
	}
	// The keeper holds nothing of the host on its stdio.
	for fd := 0; fd < 3; fd++ {
		link, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(st.InitPID), "fd", strconv.Itoa(fd)))
		if link != "/dev/null" {
			t.Errorf("keeper fd %d -> %q, want the container's /dev/null", fd, link)
		}
	}

	start := time.Now()
	if err := rt.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	t.Logf("pause of an idle container: %v", time.Since(start))
	if st, _ := rt.State(ctx, id); st.Status != Paused {
		t.Errorf("status %s after Pause", st.Status)
	}
	if _, err := rt.Exec(ctx, id, []string{"true"}, nil, nil, nil); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Errorf("Exec while paused: %v, want ErrPrecondition (it would hang)", err)
	}
	if _, err := rt.Snapshot(ctx, id); err != nil {
		t.Errorf("Snapshot while paused: %v", err)
	}
	if err := rt.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := rt.Delete(ctx, id); err != nil {
		t.Errorf("second Delete: %v", err)
	}
	if _, err := rt.State(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("State after Delete: %v, want ErrNotFound", err)
	}
	if list, err := rt.List(ctx); err != nil || len(list) != 0 {
		t.Errorf("List after Delete: %v %v", list, err)
	}
}
