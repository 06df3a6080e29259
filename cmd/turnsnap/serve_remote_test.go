package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/client"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// metric reads one sample of the daemon's /metrics ("" labels: the
// unlabelled series).
func metric(t *testing.T, c *client.Client, name string) float64 {
	t.Helper()
	text, err := c.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("metric %s: %q", name, line)
			}
			return v
		}
	}
	return 0
}

// With a remote, the daemon uploads in the background: a checkpoint
// becomes remote_durable without sync. A --wait-remote client arriving
// while a background push is in flight waits for it instead of cancelling
// it: nothing is sent twice, no upload fails.
func TestServeBackgroundUpload(t *testing.T) {
	testenv.RequireRoot(t)
	srv := miniotest.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	dir := t.TempDir()
	home, base := filepath.Join(dir, "home"), filepath.Join(dir, "base")
	os.MkdirAll(base, 0o755)
	os.WriteFile(filepath.Join(base, "a"), []byte("a\n"), 0o644)
	var created struct{ Root string }
	out, _ := mustCLI(t, home, "sandbox", "create", "s", "--base", base, "--json")
	json.Unmarshal([]byte(out), &created)
	t.Cleanup(func() { cliRun(t, home, "sandbox", "rm", "s") })
	// 1 MiB/s: a 3 MiB turn takes seconds to upload, long enough to arrive
	// while it is in flight.
	mustCLI(t, home, "init", "--remote", "s3://background/team", "--endpoint", srv.Endpoint, "--insecure", "--bwlimit", "1MiB")
	d := startDaemon(t, home, nil)
	c := d.client(t)

	var mu sync.Mutex
	durable := map[string]bool{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	committed := 0
	go c.Events(ctx, "s", func(ev api.Event) error {
		mu.Lock()
		defer mu.Unlock()
		switch ev.Type {
		case api.EventRemoteDurable:
			durable[ev.Checkpoint] = true
		case api.EventCommitted:
			committed++
		}
		return nil
	})
	// Subscribed once a (skip) turn's event arrives.
	for subscribed := false; !subscribed; {
		mustCLI(t, home, "checkpoint", "s")
		for i := 0; i < 50 && !subscribed; i++ {
			time.Sleep(10 * time.Millisecond)
			mu.Lock()
			subscribed = committed > 0
			mu.Unlock()
		}
	}
	waitDurable := func(id string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			mu.Lock()
			ok := durable[id]
			mu.Unlock()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("checkpoint %s never became remote_durable without a sync:\n%s", id, d.stderr.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	os.WriteFile(filepath.Join(created.Root, "small"), []byte("small turn\n"), 0o644)
	var c1 struct{ ID string }
	out, _ = mustCLI(t, home, "checkpoint", "s", "--json")
	json.Unmarshal([]byte(out), &c1)
	waitDurable(c1.ID)

	big := make([]byte, 3<<20)
	rand.Read(big)
	os.WriteFile(filepath.Join(created.Root, "big"), big, 0o644)
	var c2 struct{ ID string }
	out, _ = mustCLI(t, home, "checkpoint", "s", "--json")
	json.Unmarshal([]byte(out), &c2)
	deadline := time.Now().Add(30 * time.Second)
	for metric(t, c, "turnsnap_push_running") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the background push of the big turn never ran")
		}
		time.Sleep(5 * time.Millisecond)
	}
	os.WriteFile(filepath.Join(created.Root, "after"), []byte("after\n"), 0o644)
	var c3 struct {
		ID     string
		Remote bool `json:"remote_durable"`
	}
	start := time.Now()
	out, _ = mustCLI(t, home, "checkpoint", "s", "--wait-remote", "--json")
	if err := json.Unmarshal([]byte(out), &c3); err != nil || !c3.Remote {
		t.Fatalf("checkpoint --wait-remote: %q", out)
	}
	waited := time.Since(start)
	waitDurable(c2.ID)
	waitDurable(c3.ID)
	sent, uploaded := metric(t, c, "turnsnap_upload_sent_bytes_total"), metric(t, c, "turnsnap_upload_bytes_total")
	failed := metric(t, c, "turnsnap_upload_failures_total")
	text, _ := c.Metrics(context.Background())
	if failed != 0 || strings.Contains(text, `turnsnap_pushes_total{outcome="error"}`) {
		t.Fatalf("uploads failed (%v) or a push ended in error: a waiting client cancelled the push in flight?\n%s", failed, text)
	}
	if uploaded < 3<<20 || sent > uploaded+64<<10 {
		t.Fatalf("sent %v bytes for %v uploaded: something was sent twice", sent, uploaded)
	}
	mustCLI(t, home, "sync", "--json")
	var st struct {
		QueueDepth int `json:"queue_depth"`
	}
	out, _ = mustCLI(t, home, "status", "--json")
	if json.Unmarshal([]byte(out), &st); st.QueueDepth != 0 {
		t.Fatalf("queue after sync through the daemon: %s", out)
	}
	t.Logf("wait-remote behind a 3 MiB push at 1 MiB/s waited %v; sent %v bytes, uploaded %v", waited, sent, uploaded)

	// kill -9 in the middle of a background push: the next daemon resumes
	// the queue at start, without a sync.
	rand.Read(big)
	os.WriteFile(filepath.Join(created.Root, "big"), big, 0o644)
	mustCLI(t, home, "checkpoint", "s")
	for deadline := time.Now().Add(30 * time.Second); metric(t, c, "turnsnap_push_running") != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the background push never ran")
		}
	}
	d.cmd.Process.Kill()
	<-d.exited
	// (Not `status` here: a read-only open of a catalog whose writer was
	// killed fails until a writer replays its log; the daemon is that
	// writer.) The new daemon logs the queue it found, which proves the
	// killed push left work.
	d2 := startDaemon(t, home, nil)
	if !strings.Contains(d2.stderr.String(), "resuming the upload queue") {
		t.Fatalf("the restarted daemon found no queue to resume (did the killed push finish?):\n%s", d2.stderr.String())
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out, _ = mustCLI(t, home, "status", "--json")
		if json.Unmarshal([]byte(out), &st); st.QueueDepth == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the queue a killed daemon left was not resumed: %s\n%s", out, d2.stderr.String())
		}
	}
}
