package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/testenv"
)

// forget deletes what a policy does not keep but never a head, a tag or a
// checkpoint another sandbox branched from; policies are stored in the
// home and `policy apply` (ApplyPolicies) carries them out.
func TestCLIForgetAndPolicy(t *testing.T) {
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
	ids := []string{s.Checkpoint}
	for i := 1; i <= 6; i++ {
		os.WriteFile(filepath.Join(s.Root, "f"), []byte(strings.Repeat("x", i)), 0o644)
		var c struct{ ID string }
		runJSON(t, home, &c, "checkpoint", "s")
		ids = append(ids, c.ID)
	}
	// ids[0] turn 0 ... ids[6] head. Tag turn 2, branch b from turn 3.
	if out, code := run(t, home, "tag", "keep-me", ids[2]); code != 0 {
		t.Fatalf("tag: %s", out)
	}
	if out, code := run(t, home, "branch", ids[3], "b"); code != 0 {
		t.Fatalf("branch: %s", out)
	}
	if out, code := run(t, home, "forget", "s"); code != exitUsage || !strings.Contains(out, "--keep") {
		t.Fatalf("forget without a rule: exit %d %s", code, out)
	}
	type rep struct {
		DryRun    bool `json:"dry_run"`
		Sandboxes []struct {
			Sandbox       string
			Kept, Deleted []struct {
				ID      string
				Reasons []string
			}
		}
		Kept    int `json:"checkpoints_kept"`
		Deleted int `json:"checkpoints_deleted"`
	}
	var dry rep
	runJSON(t, home, &dry, "forget", "s", "--keep-last", "2", "--dry-run")
	if !dry.DryRun || dry.Kept != 4 || dry.Deleted != 3 || len(dry.Sandboxes) != 1 {
		t.Fatalf("forget --dry-run: %+v", dry)
	}
	reasons := map[string][]string{}
	for _, k := range dry.Sandboxes[0].Kept {
		reasons[k.ID] = k.Reasons
	}
	if !slices.Contains(reasons[ids[6]], "head of s") || !slices.Contains(reasons[ids[2]], "tag keep-me") ||
		!slices.Contains(reasons[ids[3]], "branched: b") || !slices.Contains(reasons[ids[5]], "last 2") {
		t.Fatalf("kept with reasons %v", reasons)
	}
	text, code := run(t, home, "forget", "s", "--keep-last", "2", "--dry-run")
	if code != 0 || !strings.Contains(text, "would delete 3") || !strings.Contains(text, "delete  "+ids[1][:12]) {
		t.Fatalf("forget --dry-run text: %s", text)
	}
	var logBefore []struct{ ID string }
	runJSON(t, home, &logBefore, "log", "s")
	if len(logBefore) != 7 {
		t.Fatalf("dry run deleted something: %d checkpoints", len(logBefore))
	}
	// prune --dry-run lists what it would delete, in text too.
	text, code = run(t, home, "prune", "--keep-last", "2", "--dry-run")
	if code != 0 || !strings.Contains(text, "would delete "+ids[1][:12]) || strings.Contains(text, ids[3][:12]) {
		t.Fatalf("prune --dry-run text:\n%s", text)
	}

	var done rep
	runJSON(t, home, &done, "forget", "s", "--keep-last", "2", "--gc")
	if done.DryRun || done.Deleted != 3 {
		t.Fatalf("forget: %+v", done)
	}
	for _, id := range []string{ids[2], ids[3], ids[5], ids[6]} {
		var v struct{ OK bool }
		runJSON(t, home, &v, "verify", id)
	}
	for _, id := range []string{ids[0], ids[1], ids[4]} {
		if out, code := run(t, home, "verify", id); code != exitNotFound {
			t.Fatalf("forgotten %s: verify exit %d %s", id[:12], code, out)
		}
	}
	var vs struct{ OK bool }
	runJSON(t, home, &vs, "verify", "--store-only")

	// Stored policies: the home's, and b's own that replaces it.
	if out, code := run(t, home, "policy", "set", "--keep-within", "0h"); code != exitUsage {
		t.Fatalf("policy set with a bad span: exit %d %s", code, out)
	}
	if out, code := run(t, home, "policy", "set", "nosuch", "--keep-last", "1"); code != exitNotFound {
		t.Fatalf("policy set for a missing sandbox: exit %d %s", code, out)
	}
	var view struct {
		Home *struct {
			KeepLast int `json:"keep_last"`
		}
		Sandboxes []struct{ Sandbox, Source string }
	}
	runJSON(t, home, &view, "policy", "set", "--keep-last", "1")
	runJSON(t, home, &view, "policy", "set", "b", "--keep-last", "5", "--keep-daily", "7")
	runJSON(t, home, &view, "policy", "show")
	if view.Home == nil || view.Home.KeepLast != 1 || len(view.Sandboxes) != 2 ||
		view.Sandboxes[0].Source != "sandbox" || view.Sandboxes[1].Source != "home" {
		t.Fatalf("policy show: %+v", view)
	}
	if text, code := run(t, home, "policy", "show", "b"); code != 0 || !strings.Contains(text, "--keep-last 5 --keep-daily 7") {
		t.Fatalf("policy show b: %s", text)
	}
	var applied rep
	runJSON(t, home, &applied, "policy", "apply")
	// s under the home's keep-last 1: the head, the tag and the branch
	// point stay, turn 5 goes; b has no checkpoint of its own.
	if applied.Deleted != 1 {
		t.Fatalf("policy apply: %+v", applied)
	}
	runJSON(t, home, &view, "policy", "clear")
	runJSON(t, home, &view, "policy", "show")
	if view.Home != nil || view.Sandboxes[1].Source != "none" {
		t.Fatalf("after policy clear: %+v", view)
	}
	// A damaged policy file is corruption, named, and bounded.
	os.WriteFile(filepath.Join(home, "retention.json"), []byte(`{"version":1,"home":{"keep_last":-4}}`), 0o600)
	if out, code := run(t, home, "policy", "show"); code != exitCorrupt || !strings.Contains(out, "retention policies") {
		t.Fatalf("policy show of a damaged file: exit %d %s", code, out)
	}
}
