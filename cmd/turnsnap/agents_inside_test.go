package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/modelserver"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/proc"
)

// Claude Code inside its sandbox (issue 26, part 1): the cached npm
// package's native binary in a sandbox whose base is the Debian image,
// started by `turnsnap exec`, its model calls through the daemon's LLM
// proxy. The container has only its own loopback: the daemon opens the
// route there (proc.AgentLLMAddr, serving this sandbox's proxy only;
// docs/LLM-PROXY.md "An agent inside its sandbox"), and `exec --agent`
// points the agent's base URL at it. The agent is started as the agent (`turnsnap exec --agent`,
// docs/PROCESSES.md "The agent's own processes"): its processes and its
// own files are not sandbox state, so turnsnap classes its turns by what
// its tools changed, as on the host.
func TestAgentClaudeCodeInsideSandbox(t *testing.T) {
	testenv.RequireRoot(t)
	in := insideSetup(t, "in")
	steps := mainSteps("/proj")
	d := startDaemon(t, in.home, nil, "--llm-listen", "127.0.0.1:0", "--llm-upstream", in.ms.Script("inside", steps...))

	evs := subscribeEvents(t, in.home, "in")
	run := in.agent(t, "fix the failing test")()
	// No turnsnap run here to close the last turn when the agent exits:
	// the platform's checkpoint after it (as run's final one).
	final, _ := mustCLI(t, in.home, "checkpoint", "in", "-m", "agent exited")
	evs.await(len(mainClasses))
	evs.stop()
	calls := in.ms.ModelCalls("inside")
	commits, failed := evs.committed()
	// Its own files (HOME, TMPDIR and its config under proc.AgentStateDir,
	// a tmpfs that is not sandbox state) change every turn; turnsnap's own
	// classes are what its tools changed, and what a checkpoint changed is
	// the project's files only.
	prev := ""
	for _, ev := range commits {
		if ev.Class != "skip" && prev != "" {
			out, _ := mustCLI(t, in.home, "diff", "in", prev, ev.Checkpoint)
			for _, line := range strings.Split(out, "\n") {
				_, p, ok := strings.Cut(line, " ")
				if ok && len(line) >= 3 && line[1] == ' ' && strings.HasPrefix(p, "/") && !strings.HasPrefix(p, "/proj/") && p != "/proj" {
					t.Errorf("checkpoint %s (%s) changed %s, not a file of the project", ev.Checkpoint, ev.Class, p)
				}
			}
		}
		prev = ev.Checkpoint
	}
	if run.code != 0 || calls != len(mainClasses)-1 || len(failed) > 0 || len(commits) != len(mainClasses) || !reflect.DeepEqual(classes(commits), mainClasses) {
		t.Fatalf("claude-code in the sandbox: exit %d, %d model calls (want %d); checkpoints %v, want %v; failed %+v\nfinal: %s\n%s\ndaemon: %s",
			run.code, calls, len(mainClasses)-1, classes(commits), mainClasses, failed, final, run, tail(d.stderr.String()))
	}
	if fileOr(filepath.Join(in.root, "proj/notes/keep.txt")) != "<missing>" || fileOr(filepath.Join(in.root, "proj/build/out.txt")) != "artifact\n" {
		t.Fatalf("the session did not run as scripted:\n%s", run)
	}
	for _, p := range []string{"root/.claude", "tmp/claude-0", "tmp/cc-socks"} {
		if _, err := os.Lstat(filepath.Join(in.root, p)); err == nil {
			t.Errorf("the agent wrote /%s in the sandbox root: its state belongs in %s", p, proc.AgentStateDir)
		}
	}
	own, _ := mustCLI(t, in.home, "exec", "in", "--", "sh", "-c", "cd "+proc.AgentStateDir+" && find . -maxdepth 2 | sort | head -20")
	if !strings.Contains(own, "./.claude") {
		t.Errorf("no Claude Code state in %s: %q", proc.AgentStateDir, own)
	}
	turns := modelTurns(t, d, "in")
	for _, n := range []int{3, 5, 6} {
		if turns[n].Conv == nil || string(turns[n].Class) != "fs" {
			t.Fatalf("no fs checkpoint for the model call of turn %d: turns %v", n, turnNumbers(turns))
		}
	}
	var bytesNew int64
	for _, ev := range commits {
		bytesNew += ev.BytesNew
	}
	t.Logf("claude-code inside its sandbox: session of %d model calls: %d checkpoints, classes %v; %d bytes new in all (the project's files and the model-call journal), %d bytes per turn; the agent's own state in %s: %q",
		calls, len(commits), classes(commits), bytesNew, bytesNew/int64(calls), proc.AgentStateDir, own)

	// Roll the mistake back: the checkpoint of turn 5 is the state before
	// reply 5's rm ran.
	mustCLI(t, in.home, "rollback", "in", turns[5].ID.String())
	if got := fileOr(filepath.Join(in.root, "proj/notes/keep.txt")); got != "design notes the agent must not lose\n" {
		t.Fatalf("after the rollback notes/keep.txt = %q", got)
	}
	if got := fileOr(filepath.Join(in.root, "proj/add.sh")); !strings.Contains(got, "$1 + $2") {
		t.Fatalf("after the rollback add.sh = %q, want the fix", got)
	}
}

// A rollback stops the agent running inside the sandbox, with every other
// process of the sandbox, and the agent started again sees the rolled-back
// files (docs/PROCESSES.md, "The agent's own processes": why it is not
// kept running).
func TestAgentInsideStoppedByRollback(t *testing.T) {
	testenv.RequireRoot(t)
	in := insideSetup(t, "rb")
	d := startDaemon(t, in.home, nil, "--llm-listen", "127.0.0.1:0", "--llm-upstream",
		in.ms.Script("long", modelserver.Bash("echo one > one.txt"), modelserver.Bash("python3 -c 'import time; time.sleep(60)'"), modelserver.Say("slept")))
	wait := in.agent(t, "write one.txt, then wait")
	// The agent is in its second tool (a 60 s wait) once the model answered
	// its second call; its first tool's file is in the checkpoint of that
	// call.
	deadline := time.Now().Add(agentTimeout)
	for in.ms.ModelCalls("long") < 2 || fileOr(filepath.Join(in.root, "proj/one.txt")) != "one\n" {
		if time.Now().After(deadline) {
			t.Fatalf("the agent never reached its second tool")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // into the sleep
	turns := modelTurns(t, d, "rb")
	if turns[1].Conv == nil {
		t.Fatalf("no checkpoint for model call 1: turns %v", turnNumbers(turns))
	}
	t0 := time.Now()
	mustCLI(t, in.home, "rollback", "rb", turns[1].ID.String()+"~1")
	run := wait()
	if run.code == 0 || time.Since(t0) > 30*time.Second || in.ms.ModelCalls("long") != 2 {
		t.Fatalf("the agent was not stopped by the rollback: %d model calls\n%s", in.ms.ModelCalls("long"), run)
	}
	if fileOr(filepath.Join(in.root, "proj/one.txt")) != "<missing>" {
		t.Fatal("the rollback left one.txt")
	}
	// Nothing of the agent's own state survives the rollback.
	if own, _ := mustCLI(t, in.home, "exec", "rb", "--", "ls", "-A", proc.AgentStateDir); own != "" {
		t.Fatalf("after the rollback %s holds %q", proc.AgentStateDir, own)
	}
	t.Logf("the rollback stopped the agent in %s: %s", time.Since(t0).Round(time.Millisecond), strings.SplitN(run.String(), "\n", 2)[0])

	// Started again (its supervisor's job), in the container the next exec
	// starts: the daemon opens the route there anew.
	url := in.ms.Script("again", modelserver.Bash("test -e one.txt || echo ROLLED-BACK"), modelserver.Say("checked"))
	if _, err := d.client(t).SetLLMUpstream(t.Context(), "rb", api.LLMUpstreamRequest{LLMUpstream: &url}); err != nil {
		t.Fatal(err)
	}
	again := in.agent(t, "check one.txt")()
	var seen bool
	for _, r := range in.ms.Requests() {
		seen = seen || (r.Script == "again" && strings.Contains(string(r.Body), "ROLLED-BACK"))
	}
	if again.code != 0 || !seen {
		t.Fatalf("the agent started again did not see the rolled-back files (saw ROLLED-BACK: %v)\n%s", seen, again)
	}
}

// The agent inside asks for the rollback itself, through the daemon's MCP
// endpoint (reached through the daemon's route on the sandbox's loopback,
// like the proxy): the
// rollback is done, and the agent, like any process of the sandbox, is
// stopped by it.
func TestAgentInsideRollsItselfBackThroughMCP(t *testing.T) {
	testenv.RequireRoot(t)
	in := insideSetup(t, "mb")
	d := startDaemon(t, in.home, nil, "--llm-listen", "127.0.0.1:0", "--llm-upstream",
		in.ms.Script("self", modelserver.Bash("echo one > one.txt"), modelserver.Bash("echo mistake > one.txt"),
			// HEAD is the checkpoint of this call (the mistake), HEAD~1
			// the one before it.
			modelserver.Tool("mcp__turnsnap__rollback", map[string]any{"checkpoint": "HEAD~1"}),
			modelserver.Bash("cat one.txt"), modelserver.Say("rolled back")))
	cfg := fmt.Sprintf(`{"mcpServers":{"turnsnap":{"type":"http","url":"http://%s/v1/sandboxes/%s/mcp"}}}`, proc.AgentLLMAddr, in.name)
	run := in.agent(t, "write one.txt; roll back mistakes", " --strict-mcp-config --mcp-config '"+cfg+"'")()
	if run.code == 0 || in.ms.ModelCalls("self") != 3 {
		t.Fatalf("the agent was not stopped by its own rollback: %d model calls (want 3: it never reads the rollback's result)\n%s\ndaemon: %s",
			in.ms.ModelCalls("self"), run, tail(d.stderr.String()))
	}
	// The rollback goes on without its caller (the agent dies when the
	// rollback stops the sandbox's processes, before it restores files):
	// the next command, an exec, waits for it, or finishes it from its
	// intent if it was cut off.
	direct := fileOr(filepath.Join(in.root, "proj/one.txt"))
	got, errs := mustCLI(t, in.home, "exec", "mb", "--", "cat", "/proj/one.txt")
	if got != "one\n" {
		t.Fatalf("after the agent's own rollback one.txt = %q (before the next command: %q)\ndaemon: %s", got, direct, tail(d.stderr.String()))
	}
	t.Logf("the agent's own rollback stopped it: %s; one.txt as its exec returned: %q (the rollback was still restoring files); the next exec: %q",
		strings.SplitN(run.String(), "\n", 2)[0], direct, errs)
}

// insideSandbox is one sandbox on the Debian image with Claude Code's
// binary in its base and a scripted model.
type insideSandbox struct {
	home, root, name string
	ms               *modelserver.Server
}

func insideSetup(t *testing.T, name string) *insideSandbox {
	t.Helper()
	if _, err := exec.LookPath("runc"); err != nil {
		testenv.Missing(t, "runc", "apt package runc")
	}
	if _, err := os.Stat(proc.DefaultCRIUPath()); err != nil {
		testenv.Missing(t, "CRIU", proc.DefaultCRIUPath())
	}
	cache := os.Getenv("TURNSNAP_CACHE")
	if cache == "" {
		cache = "/var/cache/turnsnap"
	}
	image := filepath.Join(cache, "images", "debian-bookworm-v2")
	if _, err := os.Stat(filepath.Join(image, ".complete")); err != nil {
		testenv.Missing(t, "the debian-bookworm image", "scripts/deps.d/75-debian-image.sh builds it into "+image)
	}
	// The npm package's own native binary (bin/claude.exe, what its
	// launcher runs): it needs no node (the image has one since v2).
	bin := filepath.Join(cache, "agents", "claude-code", "node_modules", "@anthropic-ai", "claude-code", "bin", "claude.exe")
	if _, err := os.Stat(bin); err != nil {
		testenv.Missing(t, "claude-code", "npm package installed by scripts/deps.sh agents into "+bin)
	}
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	// Hard links where the cache and the test's directory share a
	// filesystem (sandbox create only reads a base: it imports a copy),
	// else a copy.
	if err := exec.Command("cp", "-al", filepath.Join(image, "rootfs"), base).Run(); err != nil {
		os.RemoveAll(base)
		if out, err := exec.Command("cp", "-a", filepath.Join(image, "rootfs"), base).CombinedOutput(); err != nil {
			t.Fatalf("copy the image: %v: %s", err, out)
		}
	}
	target := filepath.Join(base, "usr/local/bin/claude")
	if err := os.Link(bin, target); err != nil {
		if out, err := exec.Command("cp", bin, target).CombinedOutput(); err != nil {
			t.Fatalf("copy claude: %v: %s", err, out)
		}
	}
	writeProject(t, filepath.Join(base, "proj"))
	in := &insideSandbox{home: filepath.Join(dir, "home"), name: name}
	var created struct{ Root string }
	out, _ := mustCLI(t, in.home, "sandbox", "create", name, "--base", base, "--json")
	json.Unmarshal([]byte(out), &created)
	in.root = created.Root
	t.Cleanup(func() { cliRun(t, in.home, "sandbox", "rm", name) })
	in.ms = modelserver.New(nil)
	t.Cleanup(in.ms.Close)
	return in
}

// netns is the path of the sandbox's container's network namespace, named
// from the home as engine/processes.go names it.
func (in *insideSandbox) netns() string {
	sum := sha256.Sum256([]byte(in.home))
	scope := hex.EncodeToString(sum[:6])
	return filepath.Join("/run/turnsnap", scope, "netns", "ts-"+scope+"-"+in.name)
}

// agent starts Claude Code in the sandbox with `turnsnap exec` (in the
// foreground, as a platform supervises its agent): in /proj, its model
// calls to the daemon's route (the base URL exec --agent sets), as the agent (--agent: not sandbox state, its
// own files in proc.AgentStateDir), transcripts not kept.
func (in *insideSandbox) agent(t *testing.T, prompt string, extra ...string) func() agentRun {
	t.Helper()
	env := []string{"env", "PATH=/usr/local/bin:/usr/bin:/bin",
		"ANTHROPIC_API_KEY=sk-ant-test", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "IS_SANDBOX=1", "DISABLE_AUTOUPDATER=1",
		"ENABLE_TOOL_SEARCH=false"} // MCP tools offered whole (agents_mcp_test.go)
	script := `cd /proj && exec claude -p "$1" --dangerously-skip-permissions --no-session-persistence` + strings.Join(extra, "") + ` </dev/null`
	argv := append(append([]string{"exec", in.name, "--agent", "--"}, env...), "sh", "-c", script, "sh", prompt)
	return startAgent(t, cli(in.home, nil, argv...))
}
