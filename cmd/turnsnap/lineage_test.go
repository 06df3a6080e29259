package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/testenv"
)

type lineageJSON struct {
	Sandboxes []struct {
		Name, Head, Origin string
		OriginSandbox      string `json:"origin_sandbox"`
	}
	Checkpoints []struct {
		ID, Parent, Sandbox, Class string
		Heads, Branches            []string
	}
}

// `log --all` shows every sandbox, where each branched off, and stays
// connected after a rollback of one sandbox to another's checkpoint.
func TestCLILogAll(t *testing.T) {
	testenv.RequireRoot(t)
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	os.WriteFile(filepath.Join(base, "a.txt"), []byte("base\n"), 0o644)
	t.Cleanup(func() {
		for _, n := range []string{"s", "b"} {
			run(t, home, "sandbox", "rm", n)
		}
	})
	var s struct{ Root, Checkpoint string }
	runJSON(t, home, &s, "sandbox", "create", "s", "--base", base)
	var c1, b1, s2 struct{ ID string }
	os.WriteFile(filepath.Join(s.Root, "one"), []byte("1"), 0o644)
	runJSON(t, home, &c1, "checkpoint", "s")
	var b struct{ Root string }
	runJSON(t, home, &b, "branch", c1.ID, "b")
	os.WriteFile(filepath.Join(b.Root, "two"), []byte("2"), 0o644)
	runJSON(t, home, &b1, "checkpoint", "b")
	// s rolls back to b's checkpoint and goes on from there.
	if out, code := run(t, home, "rollback", "s", b1.ID); code != 0 {
		t.Fatalf("rollback s to b's checkpoint: %d %s", code, out)
	}
	os.WriteFile(filepath.Join(s.Root, "three"), []byte("3"), 0o644)
	runJSON(t, home, &s2, "checkpoint", "s")

	var l lineageJSON
	runJSON(t, home, &l, "log", "--all")
	if len(l.Checkpoints) != 4 || len(l.Sandboxes) != 2 {
		t.Fatalf("log --all: %+v", l)
	}
	pos := map[string]int{}
	byID := map[string]int{}
	for i, c := range l.Checkpoints {
		pos[c.ID], byID[c.ID] = i, i
	}
	for _, c := range l.Checkpoints {
		if p, ok := pos[c.Parent]; ok && p < pos[c.ID] {
			t.Fatalf("parent %s printed before its child %s", c.Parent, c.ID)
		}
	}
	at := func(id string) ([]string, []string) {
		c := l.Checkpoints[byID[id]]
		return c.Branches, c.Heads
	}
	if br, _ := at(c1.ID); !slices.Equal(br, []string{"b"}) {
		t.Fatalf("c1 branches %v, want [b]", br)
	}
	if br, _ := at(b1.ID); !slices.Equal(br, []string{"s"}) {
		t.Fatalf("b's checkpoint, which s rolled back to and built on: branches %v, want [s]", br)
	}
	if c := l.Checkpoints[byID[s2.ID]]; c.Parent != b1.ID || !slices.Equal(c.Heads, []string{"s"}) {
		t.Fatalf("s's checkpoint after the rollback: %+v", c)
	}
	for _, sb := range l.Sandboxes {
		if sb.Name == "b" && (sb.Origin != c1.ID || sb.OriginSandbox != "s") {
			t.Fatalf("sandbox b: %+v", sb)
		}
	}
	text, code := run(t, home, "log", "--all", "--graph")
	if code != 0 || !strings.Contains(text, "HEAD of s") || !strings.Contains(text, "branched: b") || !strings.Contains(text, "[b]") {
		t.Fatalf("log --all --graph (exit %d):\n%s", code, text)
	}
	// log NAME marks where others branched off its line.
	var sl []struct {
		ID       string
		Branches []string
	}
	runJSON(t, home, &sl, "log", "s")
	marked := false
	for _, e := range sl {
		if e.ID == c1.ID && slices.Equal(e.Branches, []string{"b"}) {
			marked = true
		}
	}
	if !marked {
		t.Fatalf("log s does not mark b's branch point at %s: %+v", c1.ID, sl)
	}
	if out, code := run(t, home, "log", "--all", "s"); code != exitUsage {
		t.Fatalf("log --all NAME: exit %d %s", code, out)
	}
}

// --record-skips writes a skip turn as a record with no new bytes and the
// parent's trees; verify, prune and a catalog rebuild treat it as any record.
func TestCLIRecordSkips(t *testing.T) {
	testenv.RequireRoot(t)
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	os.WriteFile(filepath.Join(base, "a.txt"), []byte("base\n"), 0o644)
	t.Cleanup(func() { run(t, home, "sandbox", "rm", "s") })
	var s struct{ Root string }
	runJSON(t, home, &s, "sandbox", "create", "s", "--base", base)
	os.WriteFile(filepath.Join(s.Root, "one"), []byte("1"), 0o644)
	type ckpt struct {
		ID, Class, Parent string
		Turn              int
		BytesNew          int64 `json:"bytes_new"`
		ObjectsNew        int64 `json:"objects_new"`
	}
	var c1, sk, plain, c3 ckpt
	runJSON(t, home, &c1, "checkpoint", "s", "--turn", "10")
	runJSON(t, home, &plain, "checkpoint", "s", "--turn", "11")
	if plain.Class != "skip" || plain.ID != c1.ID {
		t.Fatalf("skip without --record-skips: %+v", plain)
	}
	runJSON(t, home, &sk, "checkpoint", "s", "--turn", "12", "--record-skips", "-m", "read only")
	if sk.Class != "skip" || sk.ID == c1.ID || sk.Parent != c1.ID || sk.Turn != 12 || sk.BytesNew != 0 || sk.ObjectsNew != 0 {
		t.Fatalf("recorded skip: %+v", sk)
	}
	var log []struct {
		ID, Class string
		FSTree    string `json:"fs_tree"`
		Turn      int
	}
	runJSON(t, home, &log, "log", "s")
	if len(log) != 3 || log[0].ID != sk.ID || log[0].Class != "skip" || log[0].FSTree != log[1].FSTree {
		t.Fatalf("log after a recorded skip: %+v", log)
	}
	var ver struct{ OK bool }
	runJSON(t, home, &ver, "verify", sk.ID)
	runJSON(t, home, &ver, "verify", "--store-only")
	if !ver.OK {
		t.Fatal("verify --store-only of a store with a skip record")
	}
	os.WriteFile(filepath.Join(s.Root, "two"), []byte("2"), 0o644)
	runJSON(t, home, &c3, "checkpoint", "s")
	if c3.Turn != 13 || c3.Parent != sk.ID {
		t.Fatalf("turn after a recorded skip: %+v", c3)
	}
	var rebuilt struct{ Checkpoints int }
	runJSON(t, home, &rebuilt, "catalog", "rebuild")
	if rebuilt.Checkpoints != 4 {
		t.Fatalf("rebuild: %d checkpoints, want 4", rebuilt.Checkpoints)
	}
	// Rolling back to the skip record restores its parent's files; pruning
	// it away keeps everything else verifiable.
	var rb struct{ Checkpoint string }
	runJSON(t, home, &rb, "rollback", "s", sk.ID)
	if _, err := os.Stat(filepath.Join(s.Root, "two")); !os.IsNotExist(err) {
		t.Fatal("rollback to the skip record kept a later file")
	}
	os.WriteFile(filepath.Join(s.Root, "three"), []byte("3"), 0o644)
	runJSON(t, home, &c3, "checkpoint", "s")
	var pr struct{ Deleted []string }
	runJSON(t, home, &pr, "prune", "--keep-last", "1", "--gc")
	if !slices.Contains(pr.Deleted, sk.ID) {
		t.Fatalf("prune --keep-last 1 kept the skip record: %+v", pr)
	}
	runJSON(t, home, &ver, "verify", c3.ID)
	runJSON(t, home, &ver, "verify", "--store-only")
}
