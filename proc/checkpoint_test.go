package proc

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// counterLoop keeps its count only in a shell variable and writes it out;
// nothing reads the file back, so a restored process that continues the
// count can only have got it from the image's memory.
var counterLoop = []string{"sh", "-c", `n=0; while :; do n=$((n+1)); echo $n > /tmp/counter; sleep 0.05; done`}

// pausedCount pauses id and reads the counter at that instant.
func pausedCount(t *testing.T, rt *Runtime, id, rootfs string) int {
	t.Helper()
	ctx := testCtx(t)
	for range 50 {
		if err := rt.Pause(ctx, id); err != nil {
			t.Fatal(err)
		}
		if v, ok := readInt(filepath.Join(rootfs, "tmp", "counter")); ok {
			return v
		}
		// Frozen between the truncate and the write of echo: try again.
		if err := rt.Resume(ctx, id); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("counter file never readable while paused")
	return 0
}

func TestCounterContinuesAfterRestore(t *testing.T) {
	rt := newRuntime(t)
	ctx := testCtx(t)
	rootfs := busyboxRootfs(t)
	id := startKeeper(t, rt, rootfs)
	if _, err := rt.ExecDetached(ctx, id, counterLoop, DetachOptions{}); err != nil {
		t.Fatal(err)
	}
	counter := filepath.Join(rootfs, "tmp", "counter")
	waitFor(t, 20*time.Second, "the counter to reach 30", func() bool { v, _ := readInt(counter); return v >= 30 })

	// The consistent cut: files and image from one frozen instant.
	v := pausedCount(t, rt, id, rootfs)
	img := filepath.Join(t.TempDir(), "img")
	meta, err := rt.Checkpoint(ctx, id, img, DumpOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := rt.State(ctx, id); st.Status != Paused {
		t.Errorf("status %s after Checkpoint of a paused container, want paused", st.Status)
	}
	if err := rt.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	t.Logf("counter %d at the cut; image %d bytes in %d files, dump %v", v, meta.Bytes, meta.Files, meta.DumpTime)
	waitFor(t, 10*time.Second, "the original to keep counting", func() bool { n, _ := readInt(counter); return n > v+5 })

	// Two branches of one image, side by side, each on its own copy of the
	// root whose counter file says 0: only memory can tell them v.
	var branches []string
	var started []time.Time
	for range 2 {
		rfs := copyRootfs(t, rootfs)
		if err := os.WriteFile(filepath.Join(rfs, "tmp", "counter"), []byte("0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		bid := newID(t, rt)
		start := time.Now()
		if _, err := rt.Restore(ctx, bid, rfs, img, RestoreOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Logf("restore %s: %v", bid, time.Since(start))
		branches = append(branches, rfs)
		started = append(started, start)
	}
	for i, rfs := range branches {
		f := filepath.Join(rfs, "tmp", "counter")
		first := 0
		waitFor(t, 10*time.Second, "a restored counter to write", func() bool {
			first, _ = readInt(f)
			return first != 0
		})
		// The loop sleeps 50 ms a tick, so since its restore began it can
		// have counted at most that many ticks past the image's value,
		// however slow the machine.
		most := v + 2 + int(time.Since(started[i])/(50*time.Millisecond))
		if first < v+1 || first > most {
			t.Errorf("branch %d first wrote %d; the image held %d, at most %d possible (a restart from 0 would write 1)", i, first, v, most)
		}
	}
	// All three count at once.
	files := []string{counter, filepath.Join(branches[0], "tmp", "counter"), filepath.Join(branches[1], "tmp", "counter")}
	before := make([]int, len(files))
	for i, f := range files {
		before[i], _ = readInt(f)
	}
	for i, f := range files {
		waitFor(t, 10*time.Second, "all counters to advance together", func() bool { n, _ := readInt(f); return n > before[i]+3 })
	}
	// The restored loop keeps its pid inside its namespace (its own sleep
	// children come and go, so only the loop is compared).
	loopPID := func(id string) int {
		s, err := rt.Snapshot(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range s.Procs {
			if strings.Contains(strings.Join(p.Cmdline, " "), "n=0") {
				return p.PID
			}
		}
		return 0
	}
	want := loopPID(id)
	list, err := rt.List(ctx)
	if err != nil || len(list) != 3 {
		t.Fatalf("List: %v %v, want 3 containers", list, err)
	}
	for _, c := range list {
		if got := loopPID(c.ID); got != want || got == 0 {
			t.Errorf("container %s: the loop is pid %d, want %d as in the original", c.ID, got, want)
		}
	}
}

// wget fetches url from inside container id (its network is its own).
func wget(ctx context.Context, rt *Runtime, id, url string) (string, error) {
	// busybox wget's -T timeout made it print nothing and exit 0 here; the
	// context bounds the call instead.
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	code, err := rt.Exec(ctx, id, []string{"wget", "-q", "-O", "-", url}, nil, &out, &errOut)
	if err == nil && code != 0 {
		err = errors.New(strings.TrimSpace(errOut.String()))
	}
	return out.String(), err
}

func TestHTTPServerAnswersAfterRestore(t *testing.T) {
	rt := newRuntime(t)
	ctx := testCtx(t)
	rootfs := busyboxRootfs(t)
	const page = "hello from turn 3\n"
	if err := os.WriteFile(filepath.Join(rootfs, "www", "index.html"), []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	id := startKeeper(t, rt, rootfs)
	if _, err := rt.ExecDetached(ctx, id, []string{"httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"},
		DetachOptions{Log: "/tmp/httpd.log"}); err != nil {
		t.Fatal(err)
	}
	const url = "http://127.0.0.1:8080/index.html"
	waitFor(t, 10*time.Second, "httpd to answer", func() bool { body, err := wget(ctx, rt, id, url); return err == nil && body == page })

	img := filepath.Join(t.TempDir(), "img")
	if _, err := rt.Checkpoint(ctx, id, img, DumpOptions{}); err != nil {
		t.Fatal(err)
	}
	if body, err := wget(ctx, rt, id, url); err != nil || body != page {
		t.Errorf("original after checkpoint: %q, %v", body, err)
	}
	rid := newID(t, rt)
	if _, err := rt.Restore(ctx, rid, copyRootfs(t, rootfs), img, RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	// Nothing restarted httpd: the restored process answers on the same
	// port as the original, which still runs beside it.
	if body, err := wget(ctx, rt, rid, url); err != nil || body != page {
		t.Errorf("restored server: %q, %v", body, err)
	}
	if body, err := wget(ctx, rt, id, url); err != nil || body != page {
		t.Errorf("original beside the restore: %q, %v", body, err)
	}
}

func TestRestoreRefusesMissingCPUFlag(t *testing.T) {
	rt := newRuntime(t)
	ctx := testCtx(t)
	rootfs := busyboxRootfs(t)
	id := startKeeper(t, rt, rootfs)
	if _, err := rt.ExecDetached(ctx, id, []string{"sleep", "1000"}, DetachOptions{}); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(t.TempDir(), "img")
	if _, err := rt.Checkpoint(ctx, id, img, DumpOptions{}); err != nil {
		t.Fatal(err)
	}
	// Pretend the image came from a CPU with a flag this one lacks.
	meta, err := ReadImageMeta(img)
	if err != nil {
		t.Fatal(err)
	}
	meta.Host.CPUFlags = append(meta.Host.CPUFlags, "avx10_turnsnap_test")
	if err := writeMeta(img, meta); err != nil {
		t.Fatal(err)
	}
	rid := newID(t, rt)
	_, err = rt.Restore(ctx, rid, copyRootfs(t, rootfs), img, RestoreOptions{})
	if !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("Restore: %v, want ErrPrecondition", err)
	}
	for _, want := range []string{"avx10_turnsnap_test", "filesystem only"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, err := rt.State(ctx, rid); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a refused restore left container %s: %v", rid, err)
	}
}

func TestCheckpointRefusesProcessOutsideTree(t *testing.T) {
	rt := newRuntime(t)
	ctx := testCtx(t)
	id := startKeeper(t, rt, busyboxRootfs(t))
	execCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = rt.Exec(execCtx, id, []string{"sleep", "30"}, nil, nil, nil)
	}()
	t.Cleanup(func() { cancel(); <-done })
	// Wait for the command itself, not the `runc init` that becomes it: on
	// a loaded machine the snapshot can catch the process before its exec.
	waitFor(t, 10*time.Second, "the exec'd sleep to show", func() bool {
		s, err := rt.Snapshot(ctx, id)
		return err == nil && len(s.Procs) == 1 && s.Procs[0].Outside &&
			strings.Join(s.Procs[0].Cmdline, " ") == "sleep 30"
	})
	_, err := rt.Checkpoint(ctx, id, filepath.Join(t.TempDir(), "img"), DumpOptions{})
	if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), "sleep 30") {
		t.Errorf("Checkpoint during an Exec: %v, want ErrPrecondition naming the command", err)
	}
}
