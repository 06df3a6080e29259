package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/testenv"
)

// cliStep is one command of a scenario and what it printed.
type cliStep struct {
	args []string
	out  string
	code int
}

// scenario runs every command the daemon serves on home, the way a user
// types them, and returns each command's stdout and exit code. ids are
// taken from earlier results, so the same scenario runs on any home.
func scenario(t *testing.T, home, base string, extra ...string) []cliStep {
	var steps []cliStep
	do := func(args ...string) string {
		t.Helper()
		out, errs, code := cliRun(t, home, append(args, extra...)...)
		steps = append(steps, cliStep{args, out, code})
		if code == exitError {
			t.Fatalf("turnsnap %v: exit 1 (no class): %s %s", args, out, errs)
		}
		return out
	}
	id := func(out string) string {
		var v struct{ ID string }
		if err := json.Unmarshal([]byte(out), &v); err != nil || v.ID == "" {
			t.Fatalf("no id in %q: %v", out, err)
		}
		return v.ID
	}
	var created struct{ Root string }
	json.Unmarshal([]byte(do("sandbox", "create", "s", "--base", base, "--json")), &created)
	if created.Root == "" {
		t.Fatalf("sandbox create: %+v", steps[len(steps)-1])
	}
	os.WriteFile(filepath.Join(created.Root, "f1"), []byte("turn one\n"), 0o644)
	c1 := id(do("checkpoint", "s", "--turn", "1", "-m", "first", "--json"))
	do("checkpoint", "s")
	os.WriteFile(filepath.Join(created.Root, "f2"), []byte("turn two\n"), 0o644)
	do("checkpoint", "s")
	os.Remove(filepath.Join(created.Root, "f1"))
	do("diff", "s")
	do("diff", "s", "--json")
	c3 := id(do("checkpoint", "s", "--json"))
	do("diff", "s", c1[:8], c3[:8], "--json")
	do("diff", "s", c1[:8], c3[:8])
	do("log", "s")
	do("log", "s", "--json")
	do("tag", "t1", c1[:10], "--json")
	do("tag")
	do("tag", "--json")
	do("rollback", "s", "t1", "--json")
	do("rollback", "s", c3)
	do("branch", "t1", "b", "--json")
	do("branch", "t1", "fan", "--count", "2")
	do("branch", c3, "fan2", "--count", "2", "--json")
	do("log", "s", "--graph")
	everydayScenario(do, c1, c3)
	do("sandbox", "list")
	do("sandbox", "list", "--json")
	do("sandbox", "path", "s", "--json")
	do("sandbox", "path", "s")
	do("verify", "t1", "--json")
	do("verify", "t1")
	do("verify", "--store-only", "--json")
	do("verify", "--store-only")
	do("status")
	do("status", "--json")
	do("sync")
	do("sync", "--json")
	do("checkpoint", "s", "--wait-remote", "--json")
	do("gc", "--dry-run", "--json")
	do("gc", "--dry-run")
	do("prune", "--keep-last", "10", "--dry-run", "--json")
	do("prune", "--keep-last", "10")
	do("catalog", "rebuild", "--json")
	do("catalog", "rebuild")
	do("checkpoint", "nosuch", "--json")
	do("checkpoint", "nosuch")
	do("rollback", "s", "ffffffffffff", "--json")
	do("sandbox", "create", "s", "--base", base)
	do("sandbox", "create", "bad/name", "--base", base, "--json")
	do("tag", "cafe", c1)
	do("init", "--json")
	do("sandbox", "resume", "s", "--json")
	do("verify", "nosuchtag")
	do("tag", "--delete", "t1", "--json")
	for _, n := range []string{"b", "fan-1", "fan-2", "fan2-1", "fan2-2"} {
		do("sandbox", "rm", n, "--json")
	}
	do("sandbox", "rm", "s")
	do("log", "s", "--json")
	return steps
}

// Every command through the daemon prints what it prints without one (ids,
// times and sizes aside: two homes), with the same exit code, and fails
// the same way; with --json an error is an {"error": ...} object on stdout.
func TestServeCLIEqualsDirect(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	os.MkdirAll(filepath.Join(base, "src"), 0o755)
	os.WriteFile(filepath.Join(base, "src", "main.go"), []byte("package main\n"), 0o644)
	direct, served := filepath.Join(dir, "direct"), filepath.Join(dir, "served")
	want := scenario(t, direct, base)
	startDaemon(t, served, nil)
	// --lock-wait 0s: had a command gone direct, the daemon's lock on the
	// home would fail it at once with exit 6.
	got := scenario(t, served, base, "--lock-wait", "0s")
	if len(got) != len(want) {
		t.Fatalf("%d steps through the daemon, %d direct", len(got), len(want))
	}
	for i := range want {
		w, g := want[i], got[i]
		if w.code != g.code || normalise(w.out, direct) != normalise(g.out, served) {
			t.Errorf("turnsnap %s:\ndirect (exit %d):\n%s\ndaemon (exit %d):\n%s", strings.Join(w.args, " "),
				w.code, w.out, g.code, g.out)
		}
	}
	for _, s := range got {
		if strings.Contains(strings.Join(s.args, " "), "nosuch --json") {
			var e struct {
				Error struct{ Class, Message string }
			}
			if err := json.Unmarshal([]byte(s.out), &e); err != nil || e.Error.Class != "not_found" || !strings.Contains(e.Error.Message, "nosuch") {
				t.Errorf("--json error object: %q (%v)", s.out, err)
			}
		}
	}
	// A command that must own the home is refused, naming the daemon.
	out, errs, code := cliRun(t, served, "unlock")
	if code != exitUnavailable || !strings.Contains(errs, "daemon") {
		t.Fatalf("unlock through a daemon: exit %d: %s %s", code, out, errs)
	}
}
