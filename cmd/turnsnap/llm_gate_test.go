package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/internal/testhook"
)

// The gate's timeout and failure paths through a real daemon: a checkpoint
// held at its commit (the daemon's hold hook) outlasts --llm-gate-timeout;
// a checkpoint of a sandbox whose live layer is gone (its "current" link
// moved away) fails. Strict answers 503 problem+json naming the sandbox;
// otherwise the reply goes out unchanged and the outcome is counted. (A
// route to a sandbox that does not exist never reaches the gate: it is
// answered 404, TestLLMRouteToMissingSandbox.)
func TestLLMGateTimeoutAndStrict(t *testing.T) {
	requireHoldHook(t)
	home, roots := llmHome(t, "s", "broken")
	current := filepath.Join(home, "sandboxes", "broken", "current")
	up := newLLMStub(t, "up")
	hold := t.TempDir()
	release := filepath.Join(hold, "release")
	os.WriteFile(release, nil, 0o600) // not armed yet
	env := []string{testhook.HoldAtEnv + "=" + engine.PhaseCommit + ":" + hold}
	for _, strict := range []bool{true, false} {
		args := []string{"--llm-listen", "127.0.0.1:0", "--llm-upstream", up.srv.URL, "--llm-gate-timeout", "300ms"}
		if strict {
			args = append(args, "--llm-gate-strict")
		}
		d := startDaemon(t, home, env, args...)
		st := llmStatus(t, d)
		// Timeout: the held commit outlasts the gate.
		os.Remove(release)
		ag := &llmAgent{t: t, route: routeOf(t, st, "s"), root: roots["s"], opening: "go"}
		start := time.Now()
		c := ag.step(int(time.Now().UnixNano() % 1000))
		waited := time.Since(start)
		os.WriteFile(release, nil, 0o600)
		if waited < 300*time.Millisecond {
			t.Fatalf("strict %v: the reply came after %v, before the gate's timeout", strict, waited)
		}
		checkGated(t, strict, c, "s")
		// Failure: no live layer, so the checkpoint fails at once.
		if err := os.Rename(current, current+".away"); err != nil {
			t.Fatal(err)
		}
		broken := &llmAgent{t: t, route: routeOf(t, st, "broken"), opening: "go"}
		c = broken.step(0)
		if err := os.Rename(current+".away", current); err != nil {
			t.Fatal(err)
		}
		checkGated(t, strict, c, "broken")
		cl := d.client(t)
		if n := metric(t, cl, `turnsnap_llm_gate_outcomes_total{outcome="timeout"}`); n != 1 {
			t.Fatalf("strict %v: %v timeouts counted, want 1", strict, n)
		}
		if n := metric(t, cl, `turnsnap_llm_gate_outcomes_total{outcome="failed"}`); n != 1 {
			t.Fatalf("strict %v: %v failures counted, want 1", strict, n)
		}
		if code := d.stop(t); code != 0 {
			t.Fatalf("serve exit %d", code)
		}
	}
}

func checkGated(t *testing.T, strict bool, c llmCall, sandbox string) {
	t.Helper()
	if strict {
		if c.status != 503 || c.hdr.Get("Content-Type") != "application/problem+json" || !strings.Contains(c.raw, sandbox) {
			t.Fatalf("strict gate: %d %s %q", c.status, c.hdr.Get("Content-Type"), c.raw)
		}
		return
	}
	if c.status != 200 || c.text == "" {
		t.Fatalf("gate: %d %q, want the model's reply", c.status, c.raw)
	}
}

// The remote gate holds each reply until its checkpoint is in the bucket
// (a real MinIO); a fresh home rebuilt from the bucket, its daemon started,
// restores the journal with the checkpoint: an agent replaying on a branch
// of turn 2 fast-forwards through calls 0 and 1 without the model.
func TestLLMRemoteGateFreshHome(t *testing.T) {
	home, roots := llmHome(t, "s")
	srv := miniotest.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	// Without a remote store, the remote gate is refused at start.
	if _, errs, code := cliRun(t, home, "serve", "--llm-listen", "127.0.0.1:0", "--llm-gate", "remote"); code != exitPrecondition || !strings.Contains(errs, "remote store") {
		t.Fatalf("serve --llm-gate remote without a remote: exit %d: %s", code, errs)
	}
	remote := []string{"init", "--remote", "s3://llm/team", "--endpoint", srv.Endpoint, "--insecure"}
	mustCLI(t, home, remote...)
	up := newLLMStub(t, "up")
	d := startDaemon(t, home, nil, "--llm-listen", "127.0.0.1:0", "--llm-upstream", up.srv.URL, "--llm-gate", "remote")
	st := llmStatus(t, d)
	if st.Gate != "remote" {
		t.Fatalf("gate %q", st.Gate)
	}
	ag := &llmAgent{t: t, route: routeOf(t, st, "s"), root: roots["s"], opening: "port it"}
	var first []llmCall
	for i := 0; i < 3; i++ {
		c := ag.step(i)
		if c.status != 200 {
			t.Fatalf("call %d: %d %s", i, c.status, c.raw)
		}
		first = append(first, c)
		// Released only once durable: the upload queue holds nothing.
		st, err := d.client(t).Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.QueueDepth != 0 {
			t.Fatalf("call %d released with %d objects still queued", i, st.QueueDepth)
		}
	}
	turn2 := modelTurns(t, d, "s")[2].ID.String()
	d.stop(t)

	h2 := filepath.Join(t.TempDir(), "h2")
	mustCLI(t, h2, remote...)
	mustCLI(t, h2, "catalog", "rebuild")
	mustCLI(t, h2, "branch", turn2, "copy")
	t.Cleanup(func() { cliRun(t, h2, "sandbox", "rm", "copy") })
	d2 := startDaemon(t, h2, nil, "--llm-listen", "127.0.0.1:0", "--llm-upstream", up.srv.URL)
	st2 := llmStatus(t, d2)
	before := up.calls.Load()
	again := &llmAgent{t: t, route: routeOf(t, st2, "copy"), opening: "port it"}
	for i := 0; i < 3; i++ {
		c := again.step(i)
		if fromJournal := i < 2; c.replay != fromJournal || (fromJournal && c.raw != first[i].raw) {
			t.Fatalf("fresh home, call %d: journal %v (want %v): %q", i, c.replay, fromJournal, c.raw)
		}
	}
	if n := up.calls.Load() - before; n != 1 {
		t.Fatalf("the fresh home's replay called the model %d times, want 1", n)
	}
}

// turnsnap run: exit 6 with no daemon and with a daemon without the proxy;
// with the proxy, the agent's environment points at the sandbox's route and
// run exits with the agent's status.
func TestLLMRun(t *testing.T) {
	home, roots := llmHome(t, "s")
	if _, errs, code := cliRun(t, home, "run", "s", "--", "true"); code != exitUnavailable || !strings.Contains(errs, "no daemon") {
		t.Fatalf("run with no daemon: exit %d: %s", code, errs)
	}
	d := startDaemon(t, home, nil)
	if _, errs, code := cliRun(t, home, "run", "s", "--", "true"); code != exitUnavailable || !strings.Contains(errs, "--llm-listen") {
		t.Fatalf("run with a daemon without the proxy: exit %d: %s", code, errs)
	}
	d.stop(t)
	up := newLLMStub(t, "up")
	d = startDaemon(t, home, nil, "--llm-listen", "127.0.0.1:0", "--llm-upstream", up.srv.URL)
	route := routeOf(t, llmStatus(t, d), "s")
	out, errs, code := cliRun(t, home, "run", "s", "--", "sh", "-c", `echo "$OPENAI_BASE_URL $ANTHROPIC_BASE_URL $TURNSNAP_SANDBOX $TURNSNAP_ROOT"; exit 7`)
	if code != 7 || strings.TrimSpace(out) != route+"/v1 "+route+" s "+roots["s"] {
		t.Fatalf("run: exit %d, stdout %q, stderr %s", code, out, errs)
	}
	if _, errs, code := cliRun(t, home, "run", "nosuch", "--", "true"); code != exitNotFound {
		t.Fatalf("run on a missing sandbox: exit %d: %s", code, errs)
	}
	// The README's agent, exactly as the README shows it.
	if _, err := exec.LookPath("python3"); err != nil {
		testenv.Missing(t, "python3", "apt package python3 (the README's agent)")
	}
	script := readmeAgent(t)
	py := filepath.Join(t.TempDir(), "agent.py")
	os.WriteFile(py, []byte(script), 0o644)
	out, errs, code = cliRun(t, home, "run", "s", "--", "python3", py)
	if code != 0 || !strings.Contains(out, "up reply 2") {
		t.Fatalf("README agent: exit %d\nstdout %s\nstderr %s", code, out, errs)
	}
	if n := up.calls.Load(); n != 3 {
		t.Fatalf("README agent: %d model calls, want 3", n)
	}
	// Call 0 comes before any tool call: nothing changed since the base, a
	// skip. Calls 1 and 2 follow a note each.
	if turns := modelTurns(t, d, "s"); len(turns) != 2 || turns[1].Conv == nil || turns[2].Conv == nil {
		t.Fatalf("README agent: model-call checkpoints %+v, want turns 1 and 2", turns)
	}
}

// readmeAgent is the Python block after "<!-- agent.py -->" in README.md.
func readmeAgent(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "<!-- agent.py -->\n```python\n")
	if !ok {
		t.Fatal("README.md has no agent.py block")
	}
	code, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("README.md: agent.py block not closed")
	}
	return code
}
