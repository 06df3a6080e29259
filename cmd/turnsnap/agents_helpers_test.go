package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/modelserver"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// agentTimeout bounds one agent session: a CLI that waits on something
// the scripted model never sends fails the test instead of hanging it.
const agentTimeout = 3 * time.Minute

// agentSpec says how to run one real coding agent, unmodified, the way a
// user would put it under `turnsnap run`: its command is a shell script
// run with the prompt as $1, which changes to $TURNSNAP_ROOT (run starts
// the agent on the host, wherever it was called from) and execs the CLI.
type agentSpec struct {
	name   string
	script string   // sh -c SCRIPT sh PROMPT
	resume string   // the same, continuing the agent's last session in the directory
	env    []string // the agent's own settings: a scratch HOME, a key
	// direct is the environment that points the agent straight at a model
	// base URL (what turnsnap run's AgentEnv does for the proxy's route).
	direct func(base string) []string
}

// agentBin is the CLI that scripts/deps.d/65-agents.sh installs.
func agentBin(t testing.TB, name, bin string) string {
	t.Helper()
	cache := os.Getenv("TURNSNAP_CACHE")
	if cache == "" {
		cache = "/var/cache/turnsnap"
	}
	p := filepath.Join(cache, "agents", name, "node_modules", ".bin", bin)
	if _, err := os.Stat(p); err != nil {
		testenv.Missing(t, name, "npm package installed by scripts/deps.sh agents into "+p)
	}
	if _, err := exec.LookPath("node"); err != nil {
		testenv.Missing(t, "node", "apt package nodejs (the agents' launchers)")
	}
	return p
}

// claudeCode is Claude Code in print mode. As root it accepts
// --dangerously-skip-permissions only with IS_SANDBOX=1; the
// non-essential-traffic switch keeps it off the network (no telemetry, no
// update checks), and a scratch HOME keeps its sessions out of the host's.
func claudeCode(t testing.TB) agentSpec {
	bin := agentBin(t, "claude-code", "claude")
	home := t.TempDir()
	return agentSpec{
		name:   "claude-code",
		script: `cd "$TURNSNAP_ROOT" && exec ` + bin + ` -p "$1" --dangerously-skip-permissions </dev/null`,
		resume: `cd "$TURNSNAP_ROOT" && exec ` + bin + ` -p "$1" --continue --dangerously-skip-permissions </dev/null`,
		env: []string{"HOME=" + home, "ANTHROPIC_API_KEY=sk-ant-test", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
			"IS_SANDBOX=1", "DISABLE_AUTOUPDATER=1"},
		direct: func(base string) []string { return []string{"ANTHROPIC_BASE_URL=" + base} },
	}
}

// codex is Codex CLI's `exec`. Its built-in provider does not read
// OPENAI_BASE_URL, so the script declares a provider whose base_url is
// the OPENAI_BASE_URL that turnsnap run sets (the Responses API, over
// HTTP: no websocket), with retries enough to outlast a daemon restart.
func codex(t testing.TB) agentSpec {
	bin := agentBin(t, "codex", "codex")
	home := t.TempDir()
	os.MkdirAll(filepath.Join(home, ".codex"), 0o700)
	provider := `model_providers.scripted={name="scripted",base_url="'"$OPENAI_BASE_URL"'",wire_api="responses",env_key="OPENAI_API_KEY",request_max_retries=10,stream_max_retries=10}`
	flags := ` --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox -c model_provider=scripted -c model=scripted -c '` + provider + `' "$1" </dev/null`
	return agentSpec{
		name:   "codex",
		script: `cd "$TURNSNAP_ROOT" && exec ` + bin + ` exec` + flags,
		resume: `cd "$TURNSNAP_ROOT" && exec ` + bin + ` exec resume --last` + flags,
		env:    []string{"HOME=" + home, "CODEX_HOME=" + filepath.Join(home, ".codex"), "OPENAI_API_KEY=sk-test"},
		direct: func(base string) []string { return []string{"OPENAI_BASE_URL=" + base + "/v1"} },
	}
}

// agentRun is one finished agent session.
type agentRun struct {
	stdout, stderr string
	code           int
	wall           time.Duration
}

// startAgent starts cmd with a deadline; the function it returns waits
// for it.
func startAgent(t testing.TB, cmd *exec.Cmd) func() agentRun {
	t.Helper()
	var out, errb lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	began := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
		case <-time.After(agentTimeout):
			cmd.Process.Kill()
		}
	}()
	return func() agentRun {
		cmd.Wait()
		close(done)
		return agentRun{stdout: out.String(), stderr: errb.String(), code: cmd.ProcessState.ExitCode(), wall: time.Since(began)}
	}
}

// runCmd runs the agent under `turnsnap run NAME` on home's daemon.
func (a agentSpec) runCmd(home, sandbox, prompt string) *exec.Cmd {
	return cli(home, a.env, "run", sandbox, "--", "sh", "-c", a.script, "sh", prompt)
}

// resumeCmd is runCmd continuing the agent's last session.
func (a agentSpec) resumeCmd(home, sandbox, prompt string) *exec.Cmd {
	return cli(home, a.env, "run", sandbox, "--", "sh", "-c", a.resume, "sh", prompt)
}

// directCmd runs the agent in dir straight against a model base URL.
func (a agentSpec) directCmd(dir, base, prompt string) *exec.Cmd {
	cmd := exec.Command("sh", "-c", a.script, "sh", prompt)
	cmd.Env = append(append(append(os.Environ(), a.env...), a.direct(base)...), "TURNSNAP_ROOT="+dir)
	return cmd
}

// turnEvents records a daemon's turn events for one sandbox. It subscribes
// before it returns: the stream's headers come once the subscription is
// in place, so no event of a later turn can be missed.
type turnEvents struct {
	mu      sync.Mutex
	events  []api.Event
	changed chan struct{} // closed and replaced at each event
	cancel  context.CancelFunc
	done    chan struct{}
}

func subscribeEvents(t testing.TB, home, sandbox string) *turnEvents {
	t.Helper()
	sock := filepath.Join(home, socketName)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://turnsnap/v1/events?sandbox="+sandbox, nil)
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := hc.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		cancel()
		t.Fatalf("subscribe to events of %s: %v %v", sandbox, err, resp)
	}
	l := &turnEvents{cancel: cancel, done: make(chan struct{}), changed: make(chan struct{})}
	go func() {
		defer close(l.done)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var ev api.Event
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				l.mu.Lock()
				l.events = append(l.events, ev)
				close(l.changed)
				l.changed = make(chan struct{})
				l.mu.Unlock()
			}
		}
	}()
	t.Cleanup(l.stop)
	return l
}

// await waits until n turns ended (committed or failed), or 30 s passed:
// an agent's run returns once its last checkpoint is committed, but the
// event may still be on its way through the stream.
func (l *turnEvents) await(n int) {
	deadline := time.After(30 * time.Second)
	for {
		commits, failed := l.committed()
		l.mu.Lock()
		changed := l.changed
		l.mu.Unlock()
		if len(commits)+len(failed) >= n {
			return
		}
		select {
		case <-changed:
		case <-l.done:
			return
		case <-deadline:
			return
		}
	}
}

func (l *turnEvents) stop() {
	l.cancel()
	<-l.done
}

// committed returns the committed turns so far (their classes in order)
// and the failed ones.
func (l *turnEvents) committed() (commits []api.Event, failed []api.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ev := range l.events {
		switch ev.Type {
		case api.EventCommitted:
			commits = append(commits, ev)
		case api.EventFailed:
			failed = append(failed, ev)
		}
	}
	return commits, failed
}

func classes(evs []api.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Class
	}
	return out
}

// agentGaps is, for each model call of script after the first, the time
// from the previous call's reply to this call's arrival: the agent's own
// work plus whatever sits between it and the model (the proxy's hops and
// its gate).
func agentGaps(ms *modelserver.Server, script string) []time.Duration {
	var calls []modelserver.Request
	for _, r := range ms.Requests() {
		if r.Script == script && r.Step >= 0 {
			calls = append(calls, r)
		}
	}
	var out []time.Duration
	for i := 1; i < len(calls); i++ {
		out = append(out, calls[i].Start.Sub(calls[i-1].End))
	}
	return out
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// writeProject lays out the project the agents work on: a shell "library"
// with a bug, its failing test, and notes that the agent's mistake
// deletes.
func writeProject(t testing.TB, dir string) {
	t.Helper()
	files := map[string]string{
		"README":         "the agent's project\n",
		"add.sh":         "#!/bin/sh\necho $(($1 - $2))\n",
		"test.sh":        "#!/bin/sh\ngot=$(sh ./add.sh 2 3)\nif [ \"$got\" = 5 ]; then echo PASS; else echo \"FAIL: add 2 3 = $got\"; exit 1; fi\n",
		"notes/keep.txt": "design notes the agent must not lose\n",
	}
	for p, c := range files {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// fileOr is a file's content, or "<missing>".
func fileOr(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return "<missing>"
	}
	return string(b)
}

// tail keeps the end of an agent's output for a failure message.
func tail(s string) string {
	if len(s) > 3000 {
		return "..." + s[len(s)-3000:]
	}
	return s
}

func (r agentRun) String() string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "exit %d after %s\nstdout:\n%s\nstderr:\n%s", r.code, r.wall.Round(time.Millisecond), tail(r.stdout), tail(r.stderr))
	return strings.TrimSpace(b.String())
}
