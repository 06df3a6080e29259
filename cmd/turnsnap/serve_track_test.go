package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/internal/testenv"
)

// The daemon tracks each overlay sandbox's changes (engine TrackChanges):
// through it, an unchanged turn reads no file and counts as a tracked
// scan on /metrics, and a changed turn reads only the changed files.
// Needs root (overlay mounts).
func TestServeTracksChanges(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	os.MkdirAll(base, 0o755)
	for _, n := range []string{"a", "b", "c", "d"} {
		os.WriteFile(filepath.Join(base, n), []byte("base "+n+"\n"), 0o644)
	}
	home := filepath.Join(dir, "home")
	d := startDaemon(t, home, nil)
	c := d.client(t)
	mustCLI(t, home, "sandbox", "create", "s", "--base", base)
	t.Cleanup(func() { cliRun(t, home, "sandbox", "rm", "s") }) // before the daemon stops
	out, _ := mustCLI(t, home, "sandbox", "path", "s")
	root := filepath.Clean(string(out[:len(out)-1]))
	type turn struct {
		Class     string `json:"class"`
		FilesRead int64  `json:"files_read"`
	}
	checkpoint := func() turn {
		t.Helper()
		out, _ := mustCLI(t, home, "checkpoint", "s", "--json")
		var r turn
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("checkpoint --json: %v: %s", err, out)
		}
		return r
	}
	// The first turn walks (the tracker starts with it); write one file so
	// it commits and becomes the tracker's base.
	os.WriteFile(filepath.Join(root, "a"), []byte("edited\n"), 0o644)
	if r := checkpoint(); r.Class != "fs" {
		t.Fatalf("first turn: %+v", r)
	}
	before := metric(t, c, `turnsnap_tracked_scans_total{how="unchanged"}`)
	if r := checkpoint(); r.Class != "skip" || r.FilesRead != 0 {
		t.Fatalf("unchanged turn through the daemon: %+v, want a skip reading no file", r)
	}
	if after := metric(t, c, `turnsnap_tracked_scans_total{how="unchanged"}`); after != before+1 {
		t.Fatalf("tracked unchanged scans %v -> %v, want one more", before, after)
	}
	os.WriteFile(filepath.Join(root, "b"), []byte("edited too\n"), 0o644)
	if r := checkpoint(); r.Class != "fs" || r.FilesRead != 1 {
		t.Fatalf("one-file turn through the daemon: %+v, want fs reading 1 file", r)
	}
	if n := metric(t, c, `turnsnap_tracked_scans_total{how="changed"}`); n < 1 {
		t.Fatalf("tracked changed scans: %v", n)
	}
}
