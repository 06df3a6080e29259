package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/upload"
)

// The daemon keeps its home's host lease live in the bucket, and another
// home's `sandbox adopt` respects it: refused (naming --force) while the
// owner's daemon runs, accepted once it stopped (a clean stop deletes the
// lease). With the sandbox adopted, the first home's push of its head is
// fenced.
func TestServeHostLeaseAndAdopt(t *testing.T) {
	testenv.RequireRoot(t)
	srv := miniotest.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	dir := t.TempDir()
	homeA, homeB, base := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "base")
	os.MkdirAll(base, 0o755)
	os.WriteFile(filepath.Join(base, "f"), []byte("f\n"), 0o644)
	remoteArgs := []string{"init", "--remote", "s3://leases/fleet", "--endpoint", srv.Endpoint, "--insecure"}
	mustCLI(t, homeA, remoteArgs...)
	mustCLI(t, homeB, remoteArgs...)
	mustCLI(t, homeA, "sandbox", "create", "s", "--base", base)
	t.Cleanup(func() { cliRun(t, homeA, "sandbox", "rm", "s") })
	mustCLI(t, homeA, "sync")

	var cfg struct {
		HomeID string `json:"home_id"`
	}
	data, err := os.ReadFile(filepath.Join(homeA, "config.json"))
	if err != nil || json.Unmarshal(data, &cfg) != nil || cfg.HomeID == "" {
		t.Fatalf("home a's config: %s %v", data, err)
	}
	bucket, err := upload.NewS3(context.Background(), upload.S3Config{Endpoint: srv.Endpoint, Bucket: "leases", Prefix: "fleet",
		Insecure: true, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, Region: "us-east-1"})
	if err != nil {
		t.Fatal(err)
	}
	readLease := func() (*delta.HostLease, error) {
		b, err := upload.ReadAllMax(context.Background(), bucket, delta.HostLeaseName(cfg.HomeID), delta.MaxSmallObject)
		if err != nil {
			return nil, err
		}
		var l delta.HostLease
		return &l, json.Unmarshal(b, &l)
	}

	d := startDaemon(t, homeA, nil, "--lease-ttl", "3s")
	// The lease is written at start and renewed every second.
	var first *delta.HostLease
	renewed := false
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && !renewed; time.Sleep(100 * time.Millisecond) {
		l, err := readLease()
		if errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = l
			if l.Home != cfg.HomeID || l.PID != d.cmd.Process.Pid || time.Duration(l.TTLNs) != 3*time.Second {
				t.Fatalf("lease %+v; want home %s, pid %d, ttl 3s", l, cfg.HomeID, d.cmd.Process.Pid)
			}
			continue
		}
		renewed = l.Renewed.After(first.Renewed)
	}
	if !renewed {
		t.Fatalf("the daemon's lease was not written and renewed within 20 s (first %+v)", first)
	}

	mustCLI(t, homeB, "catalog", "rebuild")
	_, errs, code := cliRun(t, homeB, "sandbox", "adopt", "s")
	if code == 0 || !strings.Contains(errs, "--force") || !strings.Contains(errs, cfg.HomeID) {
		t.Fatalf("adopt while the owner's daemon runs: exit %d: %s", code, errs)
	}
	if code := d.stop(t); code != 0 {
		t.Fatalf("daemon exit %d", code)
	}
	if _, err := readLease(); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("lease after a clean stop: %v, want deleted", err)
	}
	out, _ := mustCLI(t, homeB, "sandbox", "adopt", "s", "--json")
	var adopted struct {
		Home  string `json:"home"`
		Epoch uint64 `json:"epoch"`
	}
	if err := json.Unmarshal([]byte(out), &adopted); err != nil || adopted.Epoch != 2 {
		t.Fatalf("adopt --json: %s (%v)", out, err)
	}
	// A goes on without knowing: its push is fenced (exit 5), and so are
	// its turns afterwards.
	root, _ := mustCLI(t, homeA, "sandbox", "path", "s")
	os.WriteFile(filepath.Join(strings.TrimSpace(root), "late"), []byte("late\n"), 0o644)
	mustCLI(t, homeA, "checkpoint", "s")
	_, errs, code = cliRun(t, homeA, "sync")
	if code != 5 || !strings.Contains(errs, "fenced") && !strings.Contains(errs, "adopted") {
		t.Fatalf("a's sync after b adopted: exit %d: %s", code, errs)
	}
	_, errs, code = cliRun(t, homeA, "checkpoint", "s")
	if code != 5 || !strings.Contains(errs, "adopt") {
		t.Fatalf("a's checkpoint once fenced: exit %d: %s", code, errs)
	}
	cliRun(t, homeB, "sandbox", "rm", "s")
}
