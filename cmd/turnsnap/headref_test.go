package main

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// HEAD, HEAD~N and NAME@HEAD~N name checkpoints in every command that
// takes one (issue 24): HEAD is the head of the sandbox a command is about
// (rollback, restore, diff), NAME@HEAD works anywhere (cat, ls, branch,
// tag, verify, verify --store-only). Malformed forms exit 2; a walk past
// the first checkpoint, or past a pruned one, exits 3 saying where it
// stopped.
func TestCLIHeadRefs(t *testing.T) {
	home, root := newSandbox(t, func(base string) {
		write(t, filepath.Join(base, "a.txt"), "base\n", 0o644)
	})
	t.Cleanup(func() { run(t, home, "sandbox", "rm", "b") })
	live := func(p string) string { return filepath.Join(root, p) }
	var c []string
	for _, v := range []string{"1", "2", "3"} {
		write(t, live("f"), v+"\n", 0o644)
		c = append(c, checkpoint(t, home).ID)
	}
	catOut := func(ref string) string {
		t.Helper()
		out, code := run(t, home, "cat", ref, "/f")
		if code != 0 {
			t.Fatalf("cat %s /f: exit %d: %s", ref, code, out)
		}
		return out
	}
	for ref, want := range map[string]string{"s@HEAD": "3\n", "s@HEAD~1": "2\n", "s@HEAD~2": "1\n", "s@HEAD~": "2\n", "s@HEAD~1~1": "1\n",
		c[2][:8] + "~2": "1\n"} {
		if got := catOut(ref); got != want {
			t.Errorf("cat %s /f: %q, want %q", ref, got, want)
		}
	}
	var ls []struct{ Name string }
	runJSON(t, home, &ls, "ls", "s@HEAD~1")
	if !slices.ContainsFunc(ls, func(e struct{ Name string }) bool { return e.Name == "f" }) {
		t.Errorf("ls s@HEAD~1: %+v", ls)
	}
	var d diffOut
	runJSON(t, home, &d, "diff", "s", "HEAD~2", "HEAD")
	if !slices.Equal(d.paths(), []string{"m /f"}) {
		t.Errorf("diff s HEAD~2 HEAD: %v", d.paths())
	}
	var v struct{ Checkpoint string }
	runJSON(t, home, &v, "verify", "s@HEAD~1")
	if v.Checkpoint != c[1] {
		t.Errorf("verify s@HEAD~1 verified %s, want %s", v.Checkpoint, c[1])
	}
	var sv struct{ Checkpoints int }
	runJSON(t, home, &sv, "verify", "--store-only", "s@HEAD~2")
	if sv.Checkpoints != 1 {
		t.Errorf("verify --store-only s@HEAD~2: %+v", sv)
	}
	if out, code := run(t, home, "tag", "older", "s@HEAD~2"); code != 0 {
		t.Fatalf("tag older s@HEAD~2: exit %d: %s", code, out)
	}
	if got := catOut("older"); got != "1\n" {
		t.Errorf("tag made from s@HEAD~2 holds %q", got)
	}
	if got := catOut("older~0"); got != "1\n" {
		t.Errorf("older~0: %q", got)
	}

	// restore s HEAD~1: the sandbox's own history.
	if out, code := run(t, home, "restore", "s", "HEAD~1", "/f"); code != 0 {
		t.Fatalf("restore s HEAD~1 /f: exit %d: %s", code, out)
	}
	if got := readFile(t, live("f")); got != "2\n" {
		t.Errorf("after restore s HEAD~1 /f: %q", got)
	}
	// branch s@HEAD~1 b, then b's HEAD is that checkpoint and b's HEAD~1
	// its parent, in s's history.
	var br struct{ Root string }
	runJSON(t, home, &br, "branch", "s@HEAD~1", "b")
	if readFile(t, filepath.Join(br.Root, "f")) != "2\n" {
		t.Fatalf("branch s@HEAD~1 b: %+v", br)
	}
	if out, code := run(t, home, "rollback", "b", "HEAD~1"); code != 0 {
		t.Fatalf("rollback b HEAD~1: exit %d: %s", code, out)
	}
	if got := readFile(t, filepath.Join(br.Root, "f")); got != "1\n" {
		t.Errorf("after rollback b HEAD~1: %q", got)
	}
	if got := catOut("b@HEAD"); got != "1\n" {
		t.Errorf("b@HEAD after its rollback: %q", got)
	}
	// rollback s HEAD~2: back to c[0]; its HEAD is then c[0].
	if out, code := run(t, home, "rollback", "s", "HEAD~2"); code != 0 {
		t.Fatalf("rollback s HEAD~2: exit %d: %s", code, out)
	}
	if got := readFile(t, live("f")); got != "1\n" {
		t.Errorf("after rollback s HEAD~2: %q", got)
	}

	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"cat", "HEAD", "/f"}, exitUsage, "write NAME@HEAD"},
		{[]string{"ls", "HEAD~1"}, exitUsage, "write NAME@HEAD"},
		{[]string{"branch", "HEAD", "b2"}, exitUsage, "write NAME@HEAD"},
		{[]string{"verify", "--store-only", "HEAD"}, exitUsage, "write NAME@HEAD"},
		{[]string{"cat", "s@HEAD~x", "/f"}, exitUsage, "not ~N"},
		{[]string{"cat", "s@HEAD~10001", "/f"}, exitUsage, "more than 10000"},
		{[]string{"cat", "s@v1", "/f"}, exitUsage, "only NAME@HEAD"},
		{[]string{"tag", "HEAD", c[0]}, exitUsage, "not HEAD"},
		{[]string{"cat", "nosuch@HEAD", "/f"}, exitNotFound, "no sandbox nosuch"},
		{[]string{"verify", "--store-only", "nosuch@HEAD"}, exitNotFound, "no sandbox nosuch"},
		// s's head is now c[0]; c[0]'s parent is the base's checkpoint.
		{[]string{"rollback", "s", "HEAD~9"}, exitNotFound, "which has no parent"},
		{[]string{"diff", "s", "HEAD~9"}, exitNotFound, "which has no parent"},
	} {
		out, code := run(t, home, tc.args...)
		if code != tc.code || !strings.Contains(out, tc.says) {
			t.Errorf("turnsnap %s: exit %d, want %d saying %q: %s", strings.Join(tc.args, " "), code, tc.code, tc.says, out)
		}
	}

	// A walk past a pruned checkpoint stops at the last one there.
	run(t, home, "tag", "--delete", "older")
	run(t, home, "sandbox", "rm", "b")
	var f struct {
		CheckpointsDeleted int `json:"checkpoints_deleted"`
	}
	out, code := run(t, home, "forget", "s", "--keep-last", "1", "--json")
	if code != 0 || json.Unmarshal([]byte(out), &f) != nil {
		t.Fatalf("forget: exit %d: %s", code, out)
	}
	if out, code := run(t, home, "cat", "s@HEAD~1", "/f"); f.CheckpointsDeleted == 0 || code != exitNotFound || !strings.Contains(out, "gone (pruned)") {
		t.Errorf("cat s@HEAD~1 after forget --keep-last 1 (%d deleted): exit %d: %s", f.CheckpointsDeleted, code, out)
	}
}
