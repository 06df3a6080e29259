package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/retention"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/internal/testhook"
	"github.com/turnsnap/turnsnap/upload"
)

// A `turnsnap gc` SIGKILLed while it holds the bucket's gc lock (issue 23:
// every host's `checkpoint --wait-remote` then failed with exit 6 for ten
// minutes, and `turnsnap unlock` removed nothing, the lock not being
// stale yet). On the killed gc's own host the lock names this boot and a
// pid that has ended: another home's push goes through beside it and
// `unlock` removes it. Another host (the same lock with another boot id)
// cannot see the holder, so its pushes are refused, with the time left,
// until the window the lock states has passed, and no longer.
func TestKilledGCBlocksOnlyOtherHostsForItsWindow(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	srv := miniotest.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	dir := t.TempDir()
	h1, h2 := filepath.Join(dir, "h1"), filepath.Join(dir, "h2")
	base := filepath.Join(dir, "base")
	must(t, os.MkdirAll(base, 0o755))
	must(t, os.WriteFile(filepath.Join(base, "a"), []byte("a\n"), 0o644))
	t.Cleanup(func() { run(t, h2, "sandbox", "rm", "s") })
	for _, h := range []string{h1, h2} {
		if out, code := run(t, h, "init", "--remote", "s3://locks/team", "--endpoint", srv.Endpoint, "--insecure"); code != 0 {
			t.Fatalf("init %s: exit %d: %s", h, code, out)
		}
	}
	var created struct{ Root string }
	runJSON(t, h2, &created, "sandbox", "create", "s", "--base", base)
	turn := 0
	checkpoint := func() (string, int) { // a turn on h2, pushed before it returns
		t.Helper()
		turn++
		must(t, os.WriteFile(filepath.Join(created.Root, "turn"), []byte(fmt.Sprintln(turn)), 0o644))
		return run(t, h2, "checkpoint", "s", "--wait-remote")
	}
	if out, code := checkpoint(); code != 0 {
		t.Fatalf("checkpoint --wait-remote: exit %d: %s", code, out)
	}

	// gc on h1, killed while it holds its lock.
	flag := filepath.Join(dir, "gc-locked")
	gc := cli(h1, []string{testhook.BlockAtEnv + "=" + retention.PhaseGCLocked + ":" + flag}, "gc")
	var gcOut strings.Builder
	gc.Stdout, gc.Stderr = &gcOut, &gcOut
	must(t, gc.Start())
	exited := make(chan struct{})
	go func() { gc.Wait(); close(exited) }()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(flag); err == nil {
			break
		}
		select {
		case <-exited:
			t.Fatalf("turnsnap gc ended before it held its lock: %s", gcOut.String())
		default:
		}
		if time.Now().After(deadline) {
			gc.Process.Kill()
			t.Fatal("turnsnap gc never held its lock")
		}
	}
	must(t, gc.Process.Signal(syscall.SIGKILL))
	<-exited

	store, err := upload.NewS3(ctx, upload.S3Config{Endpoint: srv.Endpoint, Bucket: "locks", Prefix: "team", Insecure: true,
		AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	must(t, err)
	var names []string
	must(t, store.List(ctx, delta.LockPrefix, func(oi upload.ObjectInfo) error { names = append(names, oi.Name); return nil }))
	if len(names) != 1 || !strings.HasPrefix(names[0], delta.LockPrefix+"gc-") {
		t.Fatalf("lock objects after the kill: %v", names)
	}
	data, err := upload.ReadAll(ctx, store, names[0])
	must(t, err)
	var held delta.Lock
	must(t, json.Unmarshal(data, &held))
	if held.PID != gc.Process.Pid || held.BootID == "" || held.PIDNS == "" || held.PIDStart == 0 ||
		time.Duration(held.StaleAfterNs) != delta.DefaultLockStaleAfter || held.Home == "" {
		t.Fatalf("the killed gc's lock: %s", data)
	}

	// Its own host: unlock (stale only) removes the lock at once.
	var ul struct {
		Removed []struct {
			Name       string
			Stale      bool
			HolderGone bool `json:"holder_gone"`
		}
	}
	runJSON(t, h1, &ul, "unlock")
	if len(ul.Removed) != 1 || ul.Removed[0].Name != names[0] || !ul.Removed[0].Stale || !ul.Removed[0].HolderGone {
		t.Fatalf("unlock on the killed gc's host removed %+v, want %s", ul.Removed, names[0])
	}
	if out, code := checkpoint(); code != 0 {
		t.Fatalf("checkpoint --wait-remote after unlock: exit %d: %s", code, out)
	}
	// Without unlock: a push that lists the dead holder's lock is not
	// blocked by it and removes it (stale locks are litter, not locks).
	held.Refreshed = time.Now().UTC()
	data, _ = json.Marshal(held)
	must(t, upload.PutBytes(ctx, store, names[0], data))
	if out, code := checkpoint(); code != 0 {
		t.Fatalf("checkpoint --wait-remote beside the killed gc's lock on its host: exit %d: %s", code, out)
	}
	if _, err := store.Stat(ctx, names[0]); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the dead gc's lock after a push listed it: %v, want removed", err)
	}

	// Another host: the same lock, refreshed now, from another boot. Its
	// window is long enough for a loaded machine to see it fresh first.
	const window = 15 * time.Second
	other := held
	other.BootID = "another-boot"
	other.StaleAfterNs = int64(window)
	otherName := names[0] + "-another-boot"
	put := time.Now()
	other.Refreshed = put.UTC()
	data, _ = json.Marshal(other)
	must(t, upload.PutBytes(ctx, store, otherName, data))
	out, code := checkpoint()
	left := regexp.MustCompile(`stale in ([0-9.]+s), or now if its holder is gone: ` + "`turnsnap unlock`").FindStringSubmatch(out)
	if code != exitUnavailable || left == nil || !strings.Contains(out, otherName) ||
		!strings.Contains(out, fmt.Sprintf("host %s pid %d", held.Host, held.PID)) {
		t.Fatalf("checkpoint --wait-remote beside another host's fresh gc lock: exit %d: %s", code, out)
	}
	if d, err := time.ParseDuration(left[1]); err != nil || d <= 0 || d > window || d < window-time.Since(put)-time.Second {
		t.Fatalf("the error says stale in %s, %s after a lock of window %s was written", left[1], time.Since(put), window)
	}
	runJSON(t, h1, &ul, "unlock")
	if len(ul.Removed) != 0 {
		t.Fatalf("unlock removed another host's fresh lock: %+v", ul.Removed)
	}
	// The turn's upload stays queued; sync pushes it once the window has
	// passed.
	for {
		out, code := run(t, h2, "sync")
		if code == 0 {
			break
		}
		if code != exitUnavailable {
			t.Fatalf("sync beside another host's gc lock: exit %d: %s", code, out)
		}
		if time.Since(put) > window+30*time.Second {
			t.Fatalf("sync still refused %s after the lock of window %s was written: %s", time.Since(put), window, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if el := time.Since(put); el < window {
		t.Fatalf("sync got through %s after another host's gc lock of window %s was written", el, window)
	} else {
		t.Logf("another host's pushes blocked for %s by a lock of window %s", el.Round(time.Millisecond), window)
	}
	var st struct {
		Pending int `json:"objects_pending"`
	}
	runJSON(t, h2, &st, "status")
	if st.Pending != 0 {
		t.Fatalf("%d objects still queued after sync", st.Pending)
	}
}
