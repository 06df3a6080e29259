package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/modelserver"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// Claude Code with the hooks of contrib/claude-code and no LLM proxy (the
// agent talks to its model directly): a checkpoint after every tool call,
// Bash included, committed before the next tool runs; the rewind command
// rolls the last change back.
func TestAgentClaudeCodeHooks(t *testing.T) {
	testenv.RequireRoot(t)
	a := claudeCode(t)
	for _, tool := range []string{"curl", "flock", "setsid"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, tool, "the hooks' tools (apt packages curl, util-linux)")
		}
	}
	contrib, err := filepath.Abs("../../contrib/claude-code")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	home, base := filepath.Join(dir, "home"), filepath.Join(dir, "base")
	writeProject(t, base)
	var created struct{ Root string }
	out, _ := mustCLI(t, home, "sandbox", "create", "h", "--base", base, "--json")
	json.Unmarshal([]byte(out), &created)
	root := created.Root
	t.Cleanup(func() { cliRun(t, home, "sandbox", "rm", "h") })
	d := startDaemon(t, home, nil)
	sock := filepath.Join(home, socketName)

	// The first tool writes 64 MB that the checkpoint must hash and store
	// (hundreds of milliseconds), while the model answers at once: without
	// the PreToolUse gate the second tool would run before that checkpoint
	// is committed. The second tool records what the daemon holds at the
	// moment it runs.
	probe := filepath.Join(dir, "probe.json")
	ms := modelserver.New(nil)
	t.Cleanup(ms.Close)
	url := ms.Script("hooks",
		modelserver.Bash("head -c 64000000 /dev/urandom > big.bin && echo one > a.txt"),
		modelserver.Bash(`curl -sS --unix-socket "$TURNSNAP_SOCKET" http://turnsnap/v1/sandboxes/h/checkpoints > `+probe+` && echo two > b.txt`),
		modelserver.Bash("rm a.txt big.bin"), // the mistake
		modelserver.Say("done"),
	)
	env := []string{"TURNSNAP_SANDBOX=h", "TURNSNAP_SOCKET=" + sock, "TURNSNAP_HOOK_STATE=" + filepath.Join(dir, "hookstate"),
		"PATH=" + contrib + ":" + os.Getenv("PATH")}
	a.script = strings.Replace(a.script, " -p ", " --settings "+filepath.Join(contrib, "settings.json")+" -p ", 1)
	a.env = append(a.env, env...)
	run := startAgent(t, a.directCmd(root, url, "write the files"))()
	if run.code != 0 || ms.ModelCalls("hooks") != 4 {
		t.Fatalf("claude-code with the hooks: %d model calls\n%s\nhook log: %s", ms.ModelCalls("hooks"), run,
			fileOr(filepath.Join(dir, "hookstate", "hook.log")))
	}

	// When the second tool ran, the head held the first tool's file.
	var seen []api.LogEntry
	if err := json.Unmarshal([]byte(fileOr(probe)), &seen); err != nil {
		t.Fatalf("probe: %v: %s", err, fileOr(probe))
	}
	var head *api.LogEntry
	for i := range seen {
		if seen[i].Head {
			head = &seen[i]
		}
	}
	if head == nil || head.Message != "claude-code: after Bash" {
		t.Fatalf("when the second tool ran, the head was %+v (want the checkpoint after the first Bash call)\nhook log: %s", head,
			fileOr(filepath.Join(dir, "hookstate", "hook.log")))
	}
	if got, _ := mustCLI(t, home, "cat", head.ID.String(), "/a.txt"); got != "one\n" {
		t.Fatalf("the checkpoint before the second tool holds a.txt = %q", got)
	}

	// One checkpoint per tool call that changed files; Stop found nothing
	// new (a skip writes no record).
	log, err := d.client(t).Log(t.Context(), "h")
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for _, l := range log {
		if l.OnHead && strings.HasPrefix(l.Message, "claude-code:") {
			msgs = append(msgs, l.Message)
		}
	}
	if len(msgs) != 3 {
		t.Fatalf("hook checkpoints %q, want one after each of the 3 Bash calls", msgs)
	}
	if fileOr(filepath.Join(root, "a.txt")) != "<missing>" {
		t.Fatal("the mistake did not run")
	}

	// Rewind one step: the mistake is undone, the second tool's work stays.
	cmd := exec.Command(filepath.Join(contrib, "turnsnap-claude-rewind"))
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("turnsnap-claude-rewind: %v: %s", err, out)
	}
	if fileOr(filepath.Join(root, "a.txt")) != "one\n" || fileOr(filepath.Join(root, "b.txt")) != "two\n" {
		t.Fatalf("after the rewind a.txt = %q, b.txt = %q", fileOr(filepath.Join(root, "a.txt")), fileOr(filepath.Join(root, "b.txt")))
	}
	// Rewind two more: before the first tool.
	cmd = exec.Command(filepath.Join(contrib, "turnsnap-claude-rewind"), "2")
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("turnsnap-claude-rewind 2: %v: %s", err, out)
	}
	if fileOr(filepath.Join(root, "a.txt")) != "<missing>" || fileOr(filepath.Join(root, "README")) != "the agent's project\n" {
		t.Fatalf("after rewinding to the start a.txt = %q", fileOr(filepath.Join(root, "a.txt")))
	}
}
