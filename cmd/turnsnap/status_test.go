package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// status never calls a sandbox uploaded while anything it needs is queued,
// its head being another sandbox's pending checkpoint included, and shows
// the last push as a time and an age.
func TestCLIStatusNeverEarly(t *testing.T) {
	testenv.RequireRoot(t)
	srv := miniotest.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	os.WriteFile(filepath.Join(base, "a"), []byte("a\n"), 0o644)
	t.Cleanup(func() {
		for _, n := range []string{"s", "b"} {
			run(t, home, "sandbox", "rm", n)
		}
	})
	var s struct{ Root string }
	runJSON(t, home, &s, "sandbox", "create", "s", "--base", base)
	if out, code := run(t, home, "init", "--remote", "s3://status/x", "--endpoint", srv.Endpoint, "--insecure"); code != 0 {
		t.Fatalf("init: %s", out)
	}
	os.WriteFile(filepath.Join(s.Root, "one"), []byte("1"), 0o644)
	var c1, c2 struct{ ID string }
	runJSON(t, home, &c1, "checkpoint", "s")
	runJSON(t, home, &struct{}{}, "sync")
	if out, code := run(t, home, "branch", c1.ID, "b"); code != 0 {
		t.Fatalf("branch: %s", out)
	}
	type status struct {
		Pending   int `json:"objects_pending"`
		Sandboxes []struct {
			Sandbox  string
			Pending  int      `json:"objects_pending"`
			Durable  bool     `json:"remote_durable"`
			WaitsFor []string `json:"waits_for"`
		}
	}
	get := func() map[string]int {
		var st status
		runJSON(t, home, &st, "status")
		m := map[string]int{}
		for i, x := range st.Sandboxes {
			m[x.Sandbox] = i
		}
		return m
	}
	var st status
	runJSON(t, home, &st, "status")
	idx := get()
	if sb := st.Sandboxes[idx["b"]]; sb.Durable || sb.Pending == 0 {
		t.Fatalf("fresh branch with its description and head queued: %+v", sb)
	}
	if sx := st.Sandboxes[idx["s"]]; !sx.Durable {
		t.Fatalf("synced sandbox: %+v", sx)
	}
	runJSON(t, home, &struct{}{}, "sync")
	// s takes a checkpoint that stays queued; b rolls back to it.
	os.WriteFile(filepath.Join(s.Root, "two"), []byte("2"), 0o644)
	runJSON(t, home, &c2, "checkpoint", "s")
	if out, code := run(t, home, "rollback", "b", c2.ID); code != 0 {
		t.Fatalf("rollback b to s's queued checkpoint: %s", out)
	}
	runJSON(t, home, &st, "status")
	idx = get()
	if sb := st.Sandboxes[idx["b"]]; sb.Durable || !slices.Equal(sb.WaitsFor, []string{"s"}) {
		t.Fatalf("b's head is s's queued checkpoint: %+v", sb)
	}
	text, code := run(t, home, "status")
	if code != 0 || strings.Contains(text, "100%") || !strings.Contains(text, "head waits for s") {
		t.Fatalf("status text claims an upload that is not done:\n%s", text)
	}
	if !regexp.MustCompile(`last push \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+ \((now|\d+ seconds? ago)\)`).MatchString(text) {
		t.Fatalf("last push is not a readable time and age:\n%s", text)
	}
	runJSON(t, home, &struct{}{}, "sync")
	runJSON(t, home, &st, "status")
	for _, x := range st.Sandboxes {
		if !x.Durable || x.Pending != 0 {
			t.Fatalf("after sync: %+v", st)
		}
	}
	if text, _ := run(t, home, "status"); strings.Count(text, "100%") != 2 {
		t.Fatalf("after sync, both sandboxes uploaded:\n%s", text)
	}
}
