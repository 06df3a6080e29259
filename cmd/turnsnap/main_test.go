package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/testenv"
)

// run executes one CLI invocation in-process and returns stdout and the
// exit code main would use.
func run(t *testing.T, home string, args ...string) (string, int) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"--home", home, "--lock-wait", "0s"}, args...))
	err := root.Execute()
	if err == nil {
		return out.String(), 0
	}
	var ce commandExit
	if errors.As(err, &ce) {
		return out.String(), ce.code
	}
	code := exitCode(err)
	if code == exitError && usageErr(err) {
		code = exitUsage
	}
	return out.String() + err.Error(), code
}

func runJSON(t *testing.T, home string, v any, args ...string) {
	t.Helper()
	out, code := run(t, home, append(args, "--json")...)
	if code != 0 {
		t.Fatalf("turnsnap %v: exit %d: %s", args, code, out)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("turnsnap %v: bad JSON %q: %v", args, out, err)
	}
}

// runJSONExit is runJSON for a command that exits want (a partial rebuild
// prints its report and exits 10).
func runJSONExit(t *testing.T, home string, v any, want int, args ...string) {
	t.Helper()
	out, code := run(t, home, append(args, "--json")...)
	if code != want {
		t.Fatalf("turnsnap %v: exit %d, want %d: %s", args, code, want, out)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("turnsnap %v: bad JSON %q: %v", args, out, err)
	}
}

func TestCLI(t *testing.T) {
	testenv.RequireRoot(t)
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	os.WriteFile(filepath.Join(base, "a.txt"), []byte("base\n"), 0o644)
	os.Mkdir(filepath.Join(base, "tmp"), 0o755)
	t.Cleanup(func() {
		for _, n := range []string{"s", "b"} {
			run(t, home, "sandbox", "rm", n)
		}
	})

	var created struct{ Root, Checkpoint string }
	runJSON(t, home, &created, "sandbox", "create", "s", "--base", base)
	var path struct{ Root string }
	runJSON(t, home, &path, "sandbox", "path", "s")
	if path.Root != created.Root || path.Root == "" {
		t.Fatalf("sandbox path %q, create said %q", path.Root, created.Root)
	}
	os.WriteFile(filepath.Join(path.Root, "b.txt"), []byte("turn 1\n"), 0o644)

	type ckpt struct {
		ID         string   `json:"id"`
		Class      string   `json:"class"`
		BytesNew   *int64   `json:"bytes_new"`
		DurationMS *float64 `json:"duration_ms"`
		Turn       int      `json:"turn"`
	}
	var c1, c2 ckpt
	runJSON(t, home, &c1, "checkpoint", "s", "--turn", "1", "-m", "first edit")
	if c1.ID == "" || c1.Class != "fs" || c1.BytesNew == nil || *c1.BytesNew == 0 || c1.DurationMS == nil || c1.Turn != 1 {
		t.Fatalf("checkpoint --json: %+v", c1)
	}
	runJSON(t, home, &c2, "checkpoint", "s", "--turn", "2")
	if c2.Class != "skip" || *c2.BytesNew != 0 || c2.ID != c1.ID {
		t.Fatalf("no-op checkpoint --json: %+v", c2)
	}
	os.Remove(filepath.Join(path.Root, "a.txt"))
	var c3 ckpt
	runJSON(t, home, &c3, "checkpoint", "s")
	if c3.Class != "fs" || c3.Turn != 2 {
		t.Fatalf("turn after a skip: %+v (default turn is the parent's plus one)", c3)
	}

	var log []struct {
		ID, Parent, Class string
		Turn              int
	}
	runJSON(t, home, &log, "log", "s")
	if len(log) != 3 || log[0].ID != c3.ID || log[0].Parent != c1.ID || log[2].Turn != 0 {
		t.Fatalf("log --json: %+v", log)
	}
	var diff struct {
		Changes []struct{ Change, Path string }
	}
	runJSON(t, home, &diff, "diff", "s", c1.ID[:8], c3.ID[:8])
	if len(diff.Changes) != 1 || diff.Changes[0].Change != "deleted" || diff.Changes[0].Path != "/a.txt" {
		t.Fatalf("diff --json: %+v", diff)
	}
	var rb struct{ Checkpoint string }
	runJSON(t, home, &rb, "rollback", "s", c1.ID[:10])
	if rb.Checkpoint != c1.ID {
		t.Fatalf("rollback --json: %+v", rb)
	}
	if _, err := os.Stat(filepath.Join(path.Root, "a.txt")); err != nil {
		t.Fatalf("rollback did not bring a.txt back: %v", err)
	}
	var br struct{ Root string }
	runJSON(t, home, &br, "branch", c3.ID, "b")
	if _, err := os.Stat(filepath.Join(br.Root, "a.txt")); !os.IsNotExist(err) {
		t.Fatal("branch of the deleting turn has a.txt")
	}
	os.WriteFile(filepath.Join(path.Root, "c.txt"), []byte("after rollback\n"), 0o644)
	var c4 ckpt
	runJSON(t, home, &c4, "checkpoint", "s")
	graph, code := run(t, home, "log", "s", "--graph")
	if code != 0 || !strings.Contains(graph, "* ") || !strings.Contains(graph, "|/") || !strings.Contains(graph, "HEAD") {
		t.Fatalf("log --graph (exit %d):\n%s", code, graph)
	}
	var ver struct {
		OK      bool
		Objects []string
	}
	runJSON(t, home, &ver, "verify", c3.ID)
	if !ver.OK || len(ver.Objects) < 2 {
		t.Fatalf("verify --json: %+v", ver)
	}
	var list []struct{ Name, Head string }
	runJSON(t, home, &list, "sandbox", "list")
	if len(list) != 2 {
		t.Fatalf("sandbox list --json: %+v", list)
	}
	var tag struct{ Checkpoint string }
	runJSON(t, home, &tag, "tag", "known-good", c1.ID[:6])
	if tag.Checkpoint != c1.ID {
		t.Fatalf("tag --json: %+v", tag)
	}
	var rebuilt struct{ Checkpoints, Refs int }
	runJSON(t, home, &rebuilt, "catalog", "rebuild")
	if rebuilt.Checkpoints != 4 || rebuilt.Refs != 3 {
		t.Fatalf("catalog rebuild --json (want 4 checkpoints, 2 heads + 1 tag): %+v", rebuilt)
	}
	var viaTag struct{ Checkpoint string }
	runJSON(t, home, &viaTag, "verify", "known-good")
	if viaTag.Checkpoint != c1.ID {
		t.Fatalf("tag after rebuild resolves to %s, want %s", viaTag.Checkpoint, c1.ID)
	}
	var tags []struct{ Tag, Checkpoint string }
	runJSON(t, home, &tags, "tag")
	if len(tags) != 1 || tags[0].Tag != "known-good" {
		t.Fatalf("tag list: %+v", tags)
	}
	if out, code := run(t, home, "tag", "--delete", "known-good"); code != 0 {
		t.Fatalf("tag --delete: %d %s", code, out)
	}

	// Corrupt one object: verify exits 7 and names it.
	obj := filepath.Join(home, "store", ver.Objects[len(ver.Objects)-1])
	data, _ := os.ReadFile(obj)
	data[len(data)/2] ^= 1
	os.WriteFile(obj, data, 0o600)
	msg, code := run(t, home, "verify", c3.ID)
	if code != exitCorrupt || !strings.Contains(msg, ver.Objects[len(ver.Objects)-1]) {
		t.Fatalf("verify of a corrupt object: exit %d, %s", code, msg)
	}
	data[len(data)/2] ^= 1
	os.WriteFile(obj, data, 0o600)

	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"checkpoint", "nosuch"}, exitNotFound},
		{[]string{"rollback", "s", "ffffffffffff"}, exitNotFound},
		{[]string{"sandbox", "create", "s", "--base", base}, exitExists},
		{[]string{"sandbox", "create", "bad/name", "--base", base}, exitUsage},
		{[]string{"checkpoint"}, exitUsage},
		{[]string{"tag", "cafe", c1.ID}, exitUsage}, // all-hex tags would shadow id prefixes
		{[]string{"verify", "known-good"}, exitNotFound},
		{[]string{"log", "s", "--no-such-flag"}, exitUsage},
	} {
		if out, code := run(t, home, tc.args...); code != tc.code {
			t.Errorf("turnsnap %v: exit %d, want %d: %s", tc.args, code, tc.code, out)
		}
	}
}
