package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// The remote workflow as a user types it: init, checkpoint --wait-remote,
// status, then a second home restores from the bucket alone.
func TestCLIRemote(t *testing.T) {
	testenv.RequireRoot(t)
	srv := miniotest.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	dir := t.TempDir()
	h1, h2 := filepath.Join(dir, "h1"), filepath.Join(dir, "h2")
	base := filepath.Join(dir, "base")
	os.MkdirAll(base, 0o755)
	os.WriteFile(filepath.Join(base, "a"), []byte("a\n"), 0o644)
	t.Cleanup(func() {
		run(t, h1, "sandbox", "rm", "s")
		run(t, h2, "sandbox", "rm", "copy")
		run(t, h2, "sandbox", "rm", "s")
	})
	remote := []string{"init", "--remote", "s3://cli/team", "--endpoint", srv.Endpoint, "--insecure"}
	var created struct{ Root string }
	runJSON(t, h1, &created, "sandbox", "create", "s", "--base", base)
	var ini struct {
		Queued int `json:"objects_queued"`
	}
	runJSON(t, h1, &ini, remote...)
	if ini.Queued == 0 {
		t.Fatal("init queued nothing on a home with history")
	}
	var st struct {
		QueueDepth int `json:"objects_pending"`
	}
	runJSON(t, h1, &st, "status")
	if st.QueueDepth != ini.Queued {
		t.Fatalf("status queue %d, init queued %d", st.QueueDepth, ini.Queued)
	}
	os.WriteFile(filepath.Join(created.Root, "b"), []byte("turn 1\n"), 0o644)
	var ck struct {
		ID     string
		Remote bool `json:"remote_durable"`
	}
	runJSON(t, h1, &ck, "checkpoint", "s", "--wait-remote")
	if !ck.Remote {
		t.Fatalf("checkpoint --wait-remote: %+v", ck)
	}
	var sync struct {
		Uploaded int `json:"objects_uploaded"`
	}
	runJSON(t, h1, &sync, "sync")
	var after struct {
		QueueDepth int `json:"objects_pending"`
		LastPush   *struct {
			Bytes       int64   `json:"bytes_uploaded"`
			BytesPerSec float64 `json:"bytes_per_sec"`
		} `json:"last_push"`
	}
	runJSON(t, h1, &after, "status")
	if after.QueueDepth != 0 || after.LastPush == nil || after.LastPush.Bytes == 0 || after.LastPush.BytesPerSec <= 0 {
		t.Fatalf("status after pushes: %+v", after)
	}

	runJSON(t, h2, &ini, remote...)
	var rb struct{ Checkpoints int }
	runJSON(t, h2, &rb, "catalog", "rebuild")
	if rb.Checkpoints != 2 {
		t.Fatalf("rebuild on the second home found %d checkpoints", rb.Checkpoints)
	}
	var br struct{ Root string }
	runJSON(t, h2, &br, "branch", ck.ID, "copy")
	if b, err := os.ReadFile(filepath.Join(br.Root, "b")); err != nil || string(b) != "turn 1\n" {
		t.Fatalf("branch on the second home: %q %v", b, err)
	}
	var gc struct {
		Records int `json:"records"`
	}
	runJSON(t, h1, &gc, "gc", "--dry-run")
	if gc.Records != 2 {
		t.Fatalf("gc --dry-run saw %d records", gc.Records)
	}
	var ul struct{ Removed []struct{ Name string } }
	runJSON(t, h1, &ul, "unlock")
	if ul.Removed == nil || len(ul.Removed) != 0 {
		t.Fatalf("unlock with no locks: %+v", ul)
	}
	if _, code := run(t, h1, "unlock", "--all", "--stale-only"); code != exitUsage {
		t.Fatalf("unlock --all --stale-only: exit %d", code)
	}

	// A damaged record fails a --strict rebuild naming it (exit 7); a
	// rebuild (--skip-corrupt is the default) reports it and rebuilds from
	// the rest, exiting 10 (partial).
	bad := filepath.Join(h2, "store", "records", strings.Repeat("ab", 32))
	if err := os.WriteFile(bad, []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, code := run(t, h2, "catalog", "rebuild", "--strict"); code != 7 || !strings.Contains(out, strings.Repeat("ab", 32)) {
		t.Fatalf("rebuild over a damaged record: exit %d: %s", code, out)
	}
	var skip struct {
		Checkpoints int
		Result      string
		Corrupt     []struct{ Name string }
		Skipped     []struct{ Name, Class string }
	}
	runJSONExit(t, h2, &skip, exitPartial, "catalog", "rebuild", "--skip-corrupt")
	if skip.Checkpoints != 2 || skip.Result != "partial" || len(skip.Corrupt) != 1 || !strings.HasSuffix(skip.Corrupt[0].Name, strings.Repeat("ab", 32)) ||
		len(skip.Skipped) != 1 || skip.Skipped[0].Name != skip.Corrupt[0].Name || skip.Skipped[0].Class != "corrupt" {
		t.Fatalf("rebuild --skip-corrupt: %+v", skip)
	}
}
