package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/server"
)

// Hostile requests get a 4xx problem+json with a class, never a panic or
// a 5xx, and the server keeps serving.
func TestAPIHostileRequests(t *testing.T) {
	f := serve(t, nil)
	f.create(t, "s")
	hc := f.httpClient()
	huge := `{"message":"` + strings.Repeat("x", server.DefaultMaxBody+10) + `"}`
	for _, tc := range []struct {
		method, path, body string
		status             int
		class              string
	}{
		{"POST", "/v1/sandboxes/s/checkpoints", huge, 400, "invalid"},
		{"POST", "/v1/sandboxes/s/checkpoints", `{"turn": "one"}`, 400, "invalid"},
		{"POST", "/v1/sandboxes/s/checkpoints", `{"turn": 1`, 400, "invalid"},
		{"POST", "/v1/sandboxes/s/checkpoints", `{"turn": 1, "evil": true}`, 400, "invalid"},
		{"POST", "/v1/sandboxes/s/checkpoints", `{} {}`, 400, "invalid"},
		{"POST", "/v1/sandboxes/s/checkpoints", `[1,2,3]`, 400, "invalid"},
		{"POST", "/v1/sandboxes/s/checkpoints", "\x00\xff", 400, "invalid"},
		{"POST", "/v1/sandboxes/..%2F..%2Fetc/checkpoints", `{}`, 400, "invalid"},
		{"POST", "/v1/sandboxes/%2e%2e/rollback", `{"checkpoint":"x"}`, 400, "invalid"},
		{"GET", "/v1/sandboxes/a%00b/checkpoints", "", 400, "invalid"},
		{"POST", "/v1/sandboxes", `{"name":"../../escape","base":"/tmp"}`, 400, "invalid"},
		{"POST", "/v1/sandboxes", `{"name":"x","base":""}`, 400, "invalid"},
		{"POST", "/v1/sandboxes/s/rollback", `{"checkpoint":"../../../records"}`, 404, "not_found"},
		{"GET", "/v1/checkpoints/..%2F..%2Fstore", "", 404, "not_found"},
		{"POST", "/v1/checkpoints/ffff/branches", `{"name":"b","count":100000}`, 400, "invalid"},
		{"PUT", "/v1/tags/..%2Fx", `{"checkpoint":"ffff"}`, 400, "invalid"},
		{"POST", "/v1/sandboxes/s/exec", `{"argv":[]}`, 400, "invalid"},
		{"POST", "/v1/sandboxes/s/exec", `{"argv":["sh"],"stdin":"aGk=","stdin_stream":true}`, 400, "invalid"},
		{"POST", "/v1/sandboxes/s/exec", `{"argv":`, 400, "invalid"},
		{"POST", "/v1/gc", `{"grace_ms": -5}`, 400, "invalid"},
		{"POST", "/v1/prune", `{"keep_last": 0}`, 400, "invalid"},
		{"GET", "/v1/nosuch", "", 404, "not_found"},
		{"PATCH", "/v1/sandboxes", "", 404, "not_found"},
		{"GET", "/v1/sandboxes/nosuch", "", 404, "not_found"},
	} {
		req, _ := http.NewRequest(tc.method, "http://turnsnap"+tc.path, strings.NewReader(tc.body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.method, tc.path, err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var p api.Problem
		json.Unmarshal(data, &p)
		if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != "application/problem+json" || p.Class != tc.class || p.Status != tc.status {
			t.Errorf("%s %s %.40q: HTTP %d %s %s; want %d class %s", tc.method, tc.path, tc.body, resp.StatusCode,
				resp.Header.Get("Content-Type"), data, tc.status, tc.class)
		}
	}
	// Still serving, and the sandbox untouched.
	if log, err := f.c.Log(context.Background(), "s"); err != nil || len(log) != 1 {
		t.Fatalf("after the hostile requests: log %v, %v", log, err)
	}
}

// The client maps each problem back to its errdefs class.
func TestAPIErrorClassesRoundTrip(t *testing.T) {
	f := serve(t, nil)
	f.create(t, "s")
	ctx := context.Background()
	_, err := f.c.Checkpoint(ctx, "nosuch", api.CheckpointRequest{})
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "nosuch") {
		t.Errorf("checkpoint of a missing sandbox: %v", err)
	}
	_, err = f.c.CreateSandbox(ctx, api.CreateRequest{Name: "s", Base: f.base})
	if !errors.Is(err, errdefs.ErrExists) {
		t.Errorf("create of an existing sandbox: %v", err)
	}
	_, err = f.c.Sync(ctx, api.SyncRequest{})
	if !errors.Is(err, errdefs.ErrPrecondition) {
		t.Errorf("sync without a remote: %v", err)
	}
	_, err = f.c.SetTag(ctx, "cafe", api.TagRequest{Checkpoint: "ffff"})
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("an all-hex tag: %v", err)
	}
}

// GET /v1/events as SSE: a turn's started and committed events, with its
// class, bytes and phase durations; a failed turn's class.
func TestAPIEventsSSE(t *testing.T) {
	f := serve(t, nil)
	root := f.create(t, "s")
	req, _ := http.NewRequest("GET", "http://turnsnap/v1/events", nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := f.httpClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("events Content-Type %q", ct)
	}
	type sse struct {
		event, id string
		ev        api.Event
	}
	evs := make(chan sse, 16)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		var cur sse
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				cur.event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "id: "):
				cur.id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "data: "):
				json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &cur.ev)
			case line == "":
				evs <- cur
				cur = sse{}
			}
		}
		close(evs)
	}()
	os.WriteFile(filepath.Join(root, "new.txt"), []byte("turn\n"), 0o644)
	ck, err := f.c.Checkpoint(context.Background(), "s", api.CheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	f.c.Checkpoint(context.Background(), "nosuch", api.CheckpointRequest{})
	want := []string{"started", "committed", "started", "failed"}
	for i, w := range want {
		select {
		case e := <-evs:
			if e.event != w || e.ev.Type != w || e.id != e.ev.ID || !strings.HasSuffix(e.id, fmt.Sprintf(":%d", e.ev.Seq)) {
				t.Fatalf("event %d: %q (id %s) %+v, want %s", i, e.event, e.id, e.ev, w)
			}
			switch w {
			case "committed":
				if e.ev.Checkpoint != ck.ID.String() || e.ev.Class != "fs" || e.ev.BytesNew != ck.BytesNew || e.ev.BytesNew == 0 ||
					e.ev.PhasesMS["scan"] <= 0 || e.ev.PhasesMS["commit"] <= 0 || e.ev.DurationMS <= 0 {
					t.Fatalf("committed event %+v for checkpoint %+v", e.ev, ck)
				}
			case "failed":
				if e.ev.Sandbox != "nosuch" || e.ev.ErrorClass != "not_found" {
					t.Fatalf("failed event %+v", e.ev)
				}
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no %s event", w)
		}
	}
}

// Operations on different sandboxes do not wait for each other: with one
// sandbox's checkpoint held at its commit, another sandbox's checkpoint,
// log and rollback complete; the held one then completes too.
func TestAPIConcurrentSandboxesDoNotWait(t *testing.T) {
	held, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	var freed sync.Once
	free := func() { freed.Do(func() { close(release) }) }
	defer free() // a failure below must not leave a's turn held for ever
	f := serve(t, func(phase string) {
		// Only the first commit is held (sync.Once would make the others
		// wait for it too).
		if phase == engine.PhaseCommit && first.CompareAndSwap(false, true) {
			close(held)
			<-release
		}
	})
	ra, rb := f.create(t, "a"), f.create(t, "b")
	os.WriteFile(filepath.Join(ra, "a.txt"), []byte("a\n"), 0o644)
	os.WriteFile(filepath.Join(rb, "b.txt"), []byte("b\n"), 0o644)
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		_, err := f.c.Checkpoint(ctx, "a", api.CheckpointRequest{})
		done <- err
	}()
	<-held
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cb, err := f.c.Checkpoint(tctx, "b", api.CheckpointRequest{})
	if err != nil || cb.Class != api.ClassFS {
		t.Fatalf("checkpoint of b while a's is held: %+v %v", cb, err)
	}
	if _, err := f.c.Log(tctx, "b"); err != nil {
		t.Fatalf("log of b while a's checkpoint is held: %v", err)
	}
	if _, err := f.c.Log(tctx, "a"); err != nil {
		t.Fatalf("log of a (read-only) while a's checkpoint is held: %v", err)
	}
	log, _ := f.c.Log(tctx, "b")
	if _, err := f.c.Rollback(tctx, "b", api.RollbackRequest{Checkpoint: log[len(log)-1].ID.String()}); err != nil {
		t.Fatalf("rollback of b while a's checkpoint is held: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("a's held checkpoint finished early: %v", err)
	default:
	}
	free()
	if err := <-done; err != nil {
		t.Fatalf("a's checkpoint after release: %v", err)
	}
}
