package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// A rebuild that skips objects exits 10 (partial), not 0 (complete) nor a
// failure's code, directly and through the daemon; --json says "partial"
// and names each skipped object with its class; --strict fails (exit 7)
// and keeps the catalog; once the store is whole again the rebuild is
// complete (exit 0).
func TestCLIPartialRebuild(t *testing.T) {
	testenv.RequireRoot(t)
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	os.WriteFile(filepath.Join(base, "a.txt"), []byte("base\n"), 0o644)
	t.Cleanup(func() { run(t, home, "sandbox", "rm", "s") })
	var created struct{ Root string }
	runJSON(t, home, &created, "sandbox", "create", "s", "--base", base)
	os.WriteFile(filepath.Join(created.Root, "b.txt"), []byte("turn 1\n"), 0o644)
	var c1 struct{ ID string }
	runJSON(t, home, &c1, "checkpoint", "s")

	// A tag naming a checkpoint pruned elsewhere, and a garbage record.
	store := filepath.Join(home, "store")
	tag := delta.RefName(delta.RefTag, "gone")
	record := delta.RecordName(delta.Hash([]byte("{garbage")))
	for name, data := range map[string][]byte{tag: delta.EncodeRef(delta.Hash([]byte("pruned"))), record: []byte("{garbage")} {
		p := filepath.Join(store, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	type report struct {
		Result      string
		Checkpoints int
		Sandboxes   int
		Skipped     []struct{ Name, Class, Error string }
	}
	check := func(how string, r report) {
		t.Helper()
		classes := map[string]string{}
		for _, s := range r.Skipped {
			classes[s.Name] = s.Class
		}
		if r.Result != "partial" || r.Checkpoints != 2 || r.Sandboxes != 1 || len(r.Skipped) != 2 ||
			classes[tag] != "dangling" || classes[record] != "corrupt" {
			t.Fatalf("%s: %+v", how, r)
		}
	}
	var r report
	runJSONExit(t, home, &r, exitPartial, "catalog", "rebuild")
	check("catalog rebuild --json", r)
	runJSONExit(t, home, &r, exitPartial, "catalog", "rebuild", "--skip-corrupt")
	check("catalog rebuild --skip-corrupt --json", r)
	out, code := run(t, home, "catalog", "rebuild")
	if code != exitPartial || !strings.Contains(out, "PARTIALLY") || !strings.Contains(out, "skipped "+tag+" (dangling)") ||
		!strings.Contains(out, "skipped "+record+" (corrupt)") {
		t.Fatalf("catalog rebuild: exit %d: %s", code, out)
	}
	out, code = run(t, home, "catalog", "rebuild", "--strict")
	if code != exitCorrupt || !strings.Contains(out, strings.TrimPrefix(record, delta.RecordPrefix)) {
		t.Fatalf("catalog rebuild --strict: exit %d: %s", code, out)
	}
	// The sandbox and its checkpoints are all there after a partial rebuild.
	var log []struct{ ID string }
	runJSON(t, home, &log, "log", "s")
	if len(log) != 2 || log[0].ID != c1.ID {
		t.Fatalf("log after a partial rebuild: %+v", log)
	}

	// Through the daemon: the same report and exit code.
	d := startDaemon(t, home, nil)
	runJSONExit(t, home, &r, exitPartial, "catalog", "rebuild")
	check("catalog rebuild --json through the daemon", r)
	os.Remove(filepath.Join(store, tag))
	os.Remove(filepath.Join(store, record))
	runJSON(t, home, &r, "catalog", "rebuild")
	if r.Result != "complete" || len(r.Skipped) != 0 || r.Checkpoints != 2 {
		t.Fatalf("rebuild of a whole store: %+v", r)
	}
	d.stop(t)
	if out, code := run(t, home, "catalog", "rebuild"); code != 0 || strings.Contains(out, "PARTIALLY") {
		t.Fatalf("catalog rebuild of a whole store: exit %d: %s", code, out)
	}
}
