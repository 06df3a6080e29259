package server_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/server"
)

// The everyday routes over a real socket: cat streams with its trailer,
// hostile bodies are invalid, restore refuses a host directory, and a
// forget is counted in the metrics.
func TestAPIEverydayRoutes(t *testing.T) {
	f := serve(t, nil)
	ctx := context.Background()
	root := f.create(t, "s")
	content := bytes.Repeat([]byte("0123456789abcdef"), 40<<10) // several chunks
	os.WriteFile(filepath.Join(root, "big"), content, 0o644)
	cp, err := f.c.Checkpoint(ctx, "s", api.CheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ref := cp.ID.String()

	var got bytes.Buffer
	if err := f.c.Cat(ctx, ref, "/big", &got); err != nil || !bytes.Equal(got.Bytes(), content) {
		t.Fatalf("cat: %d bytes, %v", got.Len(), err)
	}
	// The raw response ends with the trailer "none" (net/http moves the
	// announcement into resp.Trailer).
	resp, err := f.httpClient().Get("http://turnsnap/v1/checkpoints/" + ref + "/content?path=/big")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Header.Get("Content-Type") != "application/octet-stream" || resp.Trailer.Get(api.CatErrorTrailer) != "none" || n != int64(len(content)) {
		t.Fatalf("cat response: %d bytes, %s, trailer %q", n, resp.Header.Get("Content-Type"), resp.Trailer)
	}
	// An empty file is a complete one.
	os.WriteFile(filepath.Join(root, "empty"), nil, 0o644)
	cp2, err := f.c.Checkpoint(ctx, "s", api.CheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got.Reset()
	if err := f.c.Cat(ctx, cp2.ID.String(), "/empty", &got); err != nil || got.Len() != 0 {
		t.Fatalf("cat of an empty file: %q, %v", got.String(), err)
	}
	for path, class := range map[string]error{"/": errdefs.ErrInvalid, "/src": errdefs.ErrInvalid, "/nosuch": errdefs.ErrNotFound, "../x": errdefs.ErrInvalid} {
		got.Reset()
		if err := f.c.Cat(ctx, ref, path, &got); !errors.Is(err, class) || got.Len() != 0 {
			t.Errorf("cat %s: %v (%d bytes), want %v", path, err, got.Len(), class)
		}
	}

	out := filepath.Join(t.TempDir(), "out")
	_, err = f.c.RestorePaths(ctx, "s", api.RestorePathsRequest{Checkpoint: ref, Paths: []string{"/big"}, To: out})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "daemon") {
		t.Fatalf("restore to a host directory through the server: %v", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("the refused restore made %s", out)
	}
	os.Remove(filepath.Join(root, "big"))
	r, err := f.c.RestorePaths(ctx, "s", api.RestorePathsRequest{Checkpoint: ref, Paths: []string{"/big"}})
	if err != nil || len(r.Paths) != 1 || r.Paths[0].Action != "restored" || r.DurationMS <= 0 {
		t.Fatalf("restore: %+v, %v", r, err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "big")); !bytes.Equal(b, content) {
		t.Fatal("restored /big differs")
	}

	d, err := f.c.DiffPaths(ctx, "s", api.DiffRequest{From: ref, To: cp2.ID.String(), Patch: true})
	if err != nil || len(d.Paths) != 1 || d.Paths[0].Path != "/empty" || d.Paths[0].Change != "added" {
		t.Fatalf("diff: %+v, %v", d, err)
	}
	if _, err := f.c.DiffPaths(ctx, "s", api.DiffRequest{To: ref}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("diff with a 'to' and no 'from': %v", err)
	}
	ls, err := f.c.Ls(ctx, ref, "")
	if err != nil || len(ls) != 2 || ls[0].Name != "big" || ls[0].Size != uint64(len(content)) {
		t.Fatalf("ls: %+v, %v", ls, err)
	}
	l, err := f.c.Lineage(ctx)
	if err != nil || len(l.Checkpoints) != 3 || l.Checkpoints[0].ID != cp2.ID {
		t.Fatalf("lineage: %+v, %v", l, err)
	}
	ps, err := f.c.Processes(ctx, "s")
	if err != nil || ps.Running || ps.Head != cp2.ID {
		t.Fatalf("ps: %+v, %v", ps, err)
	}

	hc := f.httpClient()
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/v1/forget", `{"sandbox":"s","policy":{"keep_last":1},"evil":1}`},
		{"POST", "/v1/forget", `{"sandbox":"s","all":true,"policy":{"keep_last":1}}`},
		{"POST", "/v1/forget", `{"sandbox":"s","policy":{}}`},
		{"POST", "/v1/forget", `{"sandbox":"s","policy":{"keep_last":-1}}`},
		{"PUT", "/v1/policies", `{"sandbox":"s","policy":{"keep_within":"forever"}}`},
		{"POST", "/v1/sandboxes/s/restore", `{"checkpoint":"` + ref + `","paths":[]}`},
		{"POST", "/v1/sandboxes/s/restore", `{"checkpoint":"` + ref + `","paths":["../../etc/passwd"]}`},
		{"POST", "/v1/sandboxes/s/restore", `{"checkpoint":"` + ref + `","paths":["/x"],"to":"/"}`},
		{"POST", "/v1/policies/apply", `{"gc":"yes"}`},
	} {
		req, _ := http.NewRequest(tc.method, "http://turnsnap"+tc.path, strings.NewReader(tc.body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var p api.Problem
		json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		if resp.StatusCode != 400 || p.Class != "invalid" {
			t.Errorf("%s %s %s: HTTP %d %+v, want 400 invalid", tc.method, tc.path, tc.body, resp.StatusCode, p)
		}
	}

	v, err := f.c.SetPolicy(ctx, api.PolicyOptions{Sandbox: "s", Policy: api.RetentionPolicy{KeepLast: 1}})
	if err != nil || len(v.Sandboxes) != 1 || v.Sandboxes[0].Policy == nil || v.Sandboxes[0].Policy.KeepLast != 1 {
		t.Fatalf("set policy: %+v, %v", v, err)
	}
	dry, err := f.c.Forget(ctx, api.ForgetRequest{ForgetOptions: api.ForgetOptions{Sandbox: "s", Policy: api.RetentionPolicy{KeepLast: 1}, DryRun: true}})
	if err != nil || !dry.DryRun || dry.CheckpointsDeleted != 2 || dry.GC != nil {
		t.Fatalf("forget --dry-run: %+v, %v", dry, err)
	}
	res, err := f.c.ApplyPolicies(ctx, api.ApplyPoliciesRequest{GC: true})
	if err != nil || res.CheckpointsDeleted != 2 || res.GC == nil {
		t.Fatalf("apply: %+v, %v", res, err)
	}
	m, err := f.c.Metrics(ctx)
	if err != nil || !strings.Contains(m, "\nturnsnap_forgotten_checkpoints_total 2\n") {
		t.Fatalf("metrics after forgetting 2: %v\n%s", err, m)
	}
	if v, err := f.c.ClearPolicy(ctx, "s"); err != nil || v.Sandboxes[0].Source != "none" {
		t.Fatalf("clear policy: %+v, %v", v, err)
	}
	if v, err := f.c.ShowPolicies(ctx, ""); err != nil || v.Home != nil {
		t.Fatalf("show policies: %+v, %v", v, err)
	}
}

// A client that starts a cat and stops reading does not keep the home's
// maintenance waiting: after the stall bound the cat gives up, and a
// forget (which needs the home to itself) goes through. Without the bound
// the forget below would wait as long as the client liked.
func TestAPICatStalledReader(t *testing.T) {
	f := serve(t, nil)
	ctx := context.Background()
	dir := t.TempDir()
	srv, err := server.New(f.e, server.Options{CatStall: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "stall.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv}
	go hs.Serve(l)
	defer hs.Close()
	root := f.create(t, "s")
	big := make([]byte, 16<<20) // far more than the socket's buffers hold
	rand.Read(big)
	os.WriteFile(filepath.Join(root, "big"), big, 0o644)
	cp, err := f.c.Checkpoint(ctx, "s", api.CheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /v1/checkpoints/%s/content?path=/big HTTP/1.1\r\nHost: t\r\n\r\n", cp.ID)
	head := make([]byte, 64)
	if _, err := io.ReadFull(conn, head); err != nil || !bytes.HasPrefix(head, []byte("HTTP/1.1 200")) {
		t.Fatalf("cat response: %q %v", head, err)
	}
	// The client reads no more. A forget must still get the home.
	fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := f.c.Forget(fctx, api.ForgetRequest{ForgetOptions: api.ForgetOptions{Sandbox: "s",
		Policy: api.RetentionPolicy{KeepLast: 10}, DryRun: true}}); err != nil {
		t.Fatalf("forget while a cat reader stalls: %v (after %s)", err, time.Since(start))
	}
}
