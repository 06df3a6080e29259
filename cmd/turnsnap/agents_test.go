package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/modelserver"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// Real agents (issue 26): Claude Code and Codex CLI, unmodified, edit a
// project in a sandbox over several turns through `turnsnap run` and the
// daemon's LLM proxy, against a scripted model (internal/modelserver).
func TestAgentClaudeCode(t *testing.T) { testAgent(t, claudeCode(t)) }
func TestAgentCodex(t *testing.T)      { testAgent(t, codex(t)) }

// mainSteps is the first session: a failing test, a fix, the test again,
// a build artefact, then a destructive mistake (the notes and the fixed
// source deleted), then the final answer. root is where the agent works
// (Claude Code's file tools take absolute paths).
func mainSteps(root string) []modelserver.Step {
	return []modelserver.Step{
		modelserver.Bash("sh test.sh"), // fails: add.sh subtracts
		modelserver.Read(filepath.Join(root, "add.sh")),
		modelserver.Edit(filepath.Join(root, "add.sh"), "$1 - $2", "$1 + $2"),
		modelserver.Bash("sh test.sh"), // passes
		modelserver.Bash("mkdir -p build && echo artifact > build/out.txt"),
		modelserver.Bash("rm -r notes && rm add.sh"), // the mistake
		modelserver.Say("done: the test passes"),
	}
}

// mainClasses is the class of the checkpoint each model call of mainSteps
// closes: call n holds reply n-1's tool call, so a test run or a read
// changes nothing (skip) and the edit, the build and the deletion change
// files (fs). The last is run's final checkpoint after the agent exits:
// the final answer ran no tool.
var mainClasses = []string{"skip", "skip", "skip", "fs", "skip", "fs", "fs", "skip"}

func testAgent(t *testing.T, a agentSpec) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	ms := modelserver.New(nil)
	t.Cleanup(ms.Close)
	dir := t.TempDir()
	home, base := filepath.Join(dir, "home"), filepath.Join(dir, "base")
	writeProject(t, base)

	// The agent straight against the model, in a copy of the project: the
	// baseline for what the proxy adds.
	plain := filepath.Join(dir, "plain")
	writeProject(t, plain)
	direct := startAgent(t, a.directCmd(plain, ms.Script("direct", mainSteps(plain)...), "fix the failing test"))()
	if direct.code != 0 || fileOr(filepath.Join(plain, "build/out.txt")) != "artifact\n" {
		t.Fatalf("%s straight against the model:\n%s", a.name, direct)
	}

	var created struct{ Root string }
	out, _ := mustCLI(t, home, "sandbox", "create", "s", "--base", base, "--json")
	json.Unmarshal([]byte(out), &created)
	root := created.Root
	t.Cleanup(func() {
		cliRun(t, home, "sandbox", "rm", "s")
		cliRun(t, home, "sandbox", "rm", "alt")
	})
	d := startDaemon(t, home, nil, "--llm-listen", "127.0.0.1:0", "--llm-upstream", ms.Script("main", mainSteps(root)...))
	c := d.client(t)

	// Session 1 through turnsnap run.
	evs := subscribeEvents(t, home, "s")
	run := startAgent(t, a.runCmd(home, "s", "fix the failing test"))()
	evs.await(len(mainClasses))
	evs.stop()
	if run.code != 0 {
		t.Fatalf("%s under turnsnap run:\n%s", a.name, run)
	}
	calls := ms.ModelCalls("main")
	commits, failed := evs.committed()
	if calls != len(mainClasses)-1 || len(failed) > 0 || !reflect.DeepEqual(classes(commits), mainClasses) {
		t.Fatalf("%d model calls (want %d); checkpoints %v, want one per call and run's final: %v; failed %+v\n%s",
			calls, len(mainClasses)-1, classes(commits), mainClasses, failed, run)
	}
	if fileOr(filepath.Join(root, "notes/keep.txt")) != "<missing>" || fileOr(filepath.Join(root, "build/out.txt")) != "artifact\n" {
		t.Fatalf("the session did not run as scripted:\n%s", run)
	}
	turns := modelTurns(t, d, "s")
	for _, n := range []int{3, 5, 6} {
		if turns[n].Conv == nil || string(turns[n].Class) != "fs" {
			t.Fatalf("no fs checkpoint for the model call of turn %d: %+v", n, turns)
		}
	}
	if len(turns) != 3 {
		t.Fatalf("model-call checkpoints for turns %v, want 3, 5, 6 (the others are skips)", turnNumbers(turns))
	}
	var bytesNew int64
	for _, ev := range commits {
		bytesNew += ev.BytesNew
	}
	// The proxy's cost per call, from the same run: call by call, the gap
	// before the call through turnsnap run less the same gap straight
	// against the model (the same tool ran in both).
	gDirect, gProxy := agentGaps(ms, "direct"), agentGaps(ms, "main")
	var added []time.Duration
	for i := range min(len(gDirect), len(gProxy)) {
		added = append(added, gProxy[i]-gDirect[i])
	}
	t.Logf("%s: session of %d model calls: %d checkpoints (%d with changes, %d skips, run's final included); %d bytes new in all (files and the model-call journal), %d bytes per turn",
		a.name, calls, len(commits), len(turns), len(commits)-len(turns), bytesNew, bytesNew/int64(calls))
	t.Logf("%s: time between model calls (the agent's tools + what sits between it and the model), median: direct %s, through the proxy %s; added by the proxy per call, median of call-by-call differences: %s (all: %v); session wall time direct %s, through turnsnap run %s",
		a.name, median(gDirect).Round(time.Microsecond), median(gProxy).Round(time.Microsecond), median(added).Round(time.Microsecond),
		roundAll(added), direct.wall.Round(time.Millisecond), run.wall.Round(time.Millisecond))
	if metrics, err := c.Metrics(ctx); err == nil {
		sum, n := promValue(metrics, `turnsnap_llm_gate_wait_seconds_sum{gate="local"}`), promValue(metrics, `turnsnap_llm_gate_wait_seconds_count{gate="local"}`)
		if n > 0 {
			t.Logf("%s: of which the gate held replies for their checkpoint %s per call on average (%d calls, turnsnap_llm_gate_wait_seconds)",
				a.name, time.Duration(sum/n*float64(time.Second)).Round(time.Microsecond), int(n))
		}
	}

	// Roll the mistake back: the checkpoint of turn 5 is the state before
	// reply 5's rm ran.
	mustCLI(t, home, "rollback", "s", turns[5].ID.String())
	if got := fileOr(filepath.Join(root, "notes/keep.txt")); got != "design notes the agent must not lose\n" {
		t.Fatalf("after the rollback notes/keep.txt = %q", got)
	}
	if got := fileOr(filepath.Join(root, "add.sh")); !strings.Contains(got, "$1 + $2") {
		t.Fatalf("after the rollback add.sh = %q, want the fix", got)
	}

	// A branch from the fix (turn 3) that continues differently: its own
	// script, through its own upstream.
	mustCLI(t, home, "branch", turns[3].ID.String(), "alt")
	p, err := c.SandboxPath(ctx, "alt")
	if err != nil {
		t.Fatal(err)
	}
	altURL := ms.Script("alt", modelserver.Bash("echo 'another way' > ALT.md && sh test.sh"), modelserver.Say("done on the branch"))
	if _, err := c.SetLLMUpstream(ctx, "alt", api.LLMUpstreamRequest{LLMUpstream: &altURL}); err != nil {
		t.Fatal(err)
	}
	altEvs := subscribeEvents(t, home, "alt")
	brun := startAgent(t, a.runCmd(home, "alt", "try another way"))()
	altEvs.await(3)
	altEvs.stop()
	altCommits, _ := altEvs.committed()
	if brun.code != 0 || ms.ModelCalls("alt") != 2 || !reflect.DeepEqual(classes(altCommits), []string{"skip", "fs", "skip"}) {
		t.Fatalf("%s on the branch: %d model calls, checkpoints %v (want skip, fs, skip)\n%s", a.name, ms.ModelCalls("alt"), classes(altCommits), brun)
	}
	if fileOr(filepath.Join(p.Root, "ALT.md")) != "another way\n" || !strings.Contains(fileOr(filepath.Join(p.Root, "add.sh")), "$1 + $2") ||
		fileOr(filepath.Join(p.Root, "build/out.txt")) != "<missing>" {
		t.Fatalf("the branch does not continue from the fix: ALT.md %q, build/out.txt %q", fileOr(filepath.Join(p.Root, "ALT.md")),
			fileOr(filepath.Join(p.Root, "build/out.txt")))
	}
	if fileOr(filepath.Join(root, "ALT.md")) != "<missing>" {
		t.Fatal("the branch's work leaked into the origin")
	}
	altTurns := modelTurns(t, d, "alt")
	if altTurns[1].Conv == nil || altTurns[1].Parent != turns[3].ID {
		t.Fatalf("the branch's turn 1 %+v does not continue from turn 3 %s", altTurns[1], turns[3].ID)
	}

	// A crash of the daemon mid-session: SIGKILL while the agent waits for
	// the reply to its third call; a new daemon on the same address takes
	// over, the agent's retry reaches it and the session goes on.
	llmAddr := strings.TrimPrefix(llmStatus(t, d).URL, "http://")
	resURL := ms.Script("resume", modelserver.Bash("echo one > r1.txt"), modelserver.Bash("echo two > r2.txt"),
		modelserver.Bash("echo three > r3.txt"), modelserver.Say("resumed"))
	if _, err := c.SetLLMUpstream(ctx, "s", api.LLMUpstreamRequest{LLMUpstream: &resURL}); err != nil {
		t.Fatal(err)
	}
	atCrash, resume := make(chan struct{}), make(chan struct{})
	var crashed atomic.Bool
	release := sync.OnceFunc(func() { close(resume) })
	t.Cleanup(release) // before ms.Close, which waits for the held request
	ms.OnStep(func(script string, step int) {
		if script == "resume" && step == 2 && crashed.CompareAndSwap(false, true) {
			close(atCrash)
			<-resume
		}
	})
	t0 := time.Now()
	wait := startAgent(t, a.runCmd(home, "s", "write three files"))
	select {
	case <-atCrash:
	case <-time.After(agentTimeout):
		t.Fatalf("%s never made its third call", a.name)
	}
	d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
	d = startDaemon(t, home, nil, "--llm-listen", llmAddr, "--llm-upstream", ms.URL+"/s/main")
	release()
	rrun := wait()
	ms.OnStep(nil)
	if rrun.code != 0 {
		t.Fatalf("%s across the daemon's crash:\n%s", a.name, rrun)
	}
	for f, want := range map[string]string{"r1.txt": "one\n", "r2.txt": "two\n", "r3.txt": "three\n"} {
		if got := fileOr(filepath.Join(root, f)); got != want {
			t.Fatalf("after the resumed session %s = %q", f, got)
		}
	}
	rturns := turnsSince(t, d, "s", t0)
	if rturns[3].Conv == nil {
		t.Fatalf("no checkpoint for the resumed session's turn 3: turns %v", turnNumbers(rturns))
	}
	if out, _ := mustCLI(t, home, "cat", rturns[3].ID.String(), "/r3.txt"); out != "three\n" {
		t.Fatalf("turn 3 holds r3.txt = %q", out)
	}
	if rturns[1].Conv == nil {
		t.Fatalf("the turn before the crash was lost: turns %v", turnNumbers(rturns))
	}
	n := 0
	for _, r := range ms.Requests() {
		if r.Script == "resume" && r.Step == 2 {
			n++
		}
	}
	t.Logf("%s: the daemon was killed during model call 2; the agent's retry reached the new daemon (%d deliveries of call 2); turns after the restart: %v",
		a.name, n, turnNumbers(rturns))

	// The agent's session resumed in a new run (claude --continue, codex
	// exec resume --last) on the new daemon: it carries the whole earlier
	// conversation, and each of its calls is a checkpoint again.
	contURL := ms.Script("continued", modelserver.Bash("echo four > r4.txt"), modelserver.Bash("echo four > r4.txt"),
		modelserver.Bash("echo four > r4.txt"), modelserver.Bash("echo four > r4.txt"), modelserver.Bash("echo four > r4.txt"),
		modelserver.Say("continued"), modelserver.Say("continued"), modelserver.Say("continued"), modelserver.Say("continued"), modelserver.Say("continued"))
	if _, err := c.SetLLMUpstream(ctx, "s", api.LLMUpstreamRequest{LLMUpstream: &contURL}); err != nil {
		t.Fatal(err)
	}
	contEvs := subscribeEvents(t, home, "s")
	crun := startAgent(t, a.resumeCmd(home, "s", "go on"))()
	contEvs.await(ms.ModelCalls("continued") + 1)
	contEvs.stop()
	contCommits, contFailed := contEvs.committed()
	var first = -1
	for _, r := range ms.Requests() {
		if r.Script == "continued" && r.Step >= 0 && first < 0 {
			first = r.Step
		}
	}
	if crun.code != 0 || first < 3 || len(contFailed) > 0 || len(contCommits) != ms.ModelCalls("continued")+1 ||
		fileOr(filepath.Join(root, "r4.txt")) != "four\n" {
		t.Fatalf("%s resumed: first call at step %d (want the earlier session's turns, 3 or more), %d model calls, checkpoints %v, failed %v, r4.txt %q\n%s",
			a.name, first, ms.ModelCalls("continued"), classes(contCommits), contFailed, fileOr(filepath.Join(root, "r4.txt")), crun)
	}
	t.Logf("%s: the resumed session's first call held %d model turns of the earlier one; %d calls, checkpoints %v",
		a.name, first, ms.ModelCalls("continued"), classes(contCommits))
}

// promValue is the value of the sample named exactly series in a
// Prometheus text exposition, or 0.
func promValue(text, series string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(100 * time.Microsecond)
	}
	return out
}

func turnNumbers(m map[int]api.LogEntry) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// turnsSince is like modelTurns, for the model-call checkpoints on the
// head made after t0 only (a later session numbers its turns from 0
// again).
func turnsSince(t *testing.T, d *daemonProc, name string, t0 time.Time) map[int]api.LogEntry {
	t.Helper()
	log, err := d.client(t).Log(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]api.LogEntry{}
	for _, l := range log {
		if l.Conv != nil && l.OnHead && l.Created.After(t0) {
			out[l.Turn] = l
		}
	}
	return out
}
