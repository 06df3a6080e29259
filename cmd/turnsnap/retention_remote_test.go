package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// With a remote, prune and forget only mark what they drop (the default
// grace is an hour) and say so, in text and JSON, with the date after which
// a later run deletes it; --grace 0 deletes in this run.
func TestCLIPruneMarksOnASharedBucket(t *testing.T) {
	testenv.RequireRoot(t)
	srv := miniotest.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	dir := t.TempDir()
	home, base := filepath.Join(dir, "h"), filepath.Join(dir, "base")
	os.MkdirAll(base, 0o755)
	os.WriteFile(filepath.Join(base, "a"), []byte("a\n"), 0o644)
	t.Cleanup(func() { run(t, home, "sandbox", "rm", "s") })
	var created struct{ Root string }
	runJSON(t, home, &created, "sandbox", "create", "s", "--base", base)
	runJSON(t, home, &struct{}{}, "init", "--remote", "s3://marks/team", "--endpoint", srv.Endpoint, "--insecure")
	for i := range 2 {
		os.WriteFile(filepath.Join(created.Root, "b"), []byte{byte('0' + i)}, 0o644)
		runJSON(t, home, &struct{}{}, "checkpoint", "s")
	}
	runJSON(t, home, &struct{}{}, "sync")

	type entry struct {
		ID          string    `json:"id"`
		DeleteAfter time.Time `json:"delete_after"`
	}
	var pr struct {
		Deleted []string `json:"deleted"`
		Marked  []entry  `json:"marked"`
		NMarked int      `json:"checkpoints_marked"`
	}
	runJSON(t, home, &pr, "prune", "--keep-last", "1")
	if len(pr.Deleted) != 0 || len(pr.Marked) != 2 || pr.NMarked != 2 {
		t.Fatalf("prune with the default grace: %+v; want 2 marked, none deleted", pr)
	}
	for _, m := range pr.Marked {
		if d := time.Until(m.DeleteAfter); d < 55*time.Minute || d > time.Hour {
			t.Fatalf("marked %s to be deleted after %s, in %s", m.ID, m.DeleteAfter, d)
		}
	}
	text, code := run(t, home, "prune", "--keep-last", "1")
	t.Logf("prune:\n%s", text)
	if code != 0 || strings.Count(text, "deleted after ") != 2 || !strings.Contains(text, "marked "+pr.Marked[0].ID[:12]) ||
		!strings.Contains(text, "deleted 0, marked 2 for deletion") {
		t.Fatalf("prune text, exit %d:\n%s", code, text)
	}
	var fg struct {
		Marked    int `json:"checkpoints_marked"`
		Deleted   int `json:"checkpoints_deleted"`
		Sandboxes []struct {
			Marked []entry `json:"marked"`
		} `json:"sandboxes"`
	}
	runJSON(t, home, &fg, "forget", "s", "--keep-last", "1")
	if fg.Marked != 2 || fg.Deleted != 0 || len(fg.Sandboxes) != 1 || len(fg.Sandboxes[0].Marked) != 2 {
		t.Fatalf("forget with the default grace: %+v", fg)
	}
	text, code = run(t, home, "forget", "s", "--keep-last", "1")
	t.Logf("forget:\n%s", text)
	if code != 0 || strings.Count(text, "deleted after ") != 2 {
		t.Fatalf("forget text, exit %d:\n%s", code, text)
	}
	runJSON(t, home, &pr, "prune", "--keep-last", "1", "--grace", "0")
	if len(pr.Deleted) != 2 || len(pr.Marked) != 0 {
		t.Fatalf("prune --grace 0: %+v; want the 2 marked deleted", pr)
	}
}
