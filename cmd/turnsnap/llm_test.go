package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/turnsnap/turnsnap/internal/testenv"
)

// llmHome is a home with sandboxes a and b (default upstream) made in
// direct mode, and the root of each.
func llmHome(t *testing.T, names ...string) (home string, roots map[string]string) {
	t.Helper()
	testenv.RequireRoot(t)
	dir := t.TempDir()
	home, base := filepath.Join(dir, "home"), filepath.Join(dir, "base")
	os.MkdirAll(base, 0o755)
	os.WriteFile(filepath.Join(base, "README"), []byte("the agent's repository\n"), 0o644)
	roots = map[string]string{}
	for _, n := range names {
		var created struct{ Root string }
		out, _ := mustCLI(t, home, "sandbox", "create", n, "--base", base, "--json")
		json.Unmarshal([]byte(out), &created)
		roots[n] = created.Root
		t.Cleanup(func() { cliRun(t, home, "sandbox", "rm", n) })
	}
	return home, roots
}

// The proxy through a real daemon: three sandboxes at once, both shapes,
// streamed and not, one on its own upstream. Every model call closes a
// turn (in the log with its conversation); after a rollback to turn 2 a
// replaying agent gets calls 0 and 1 from the journal byte for byte, then
// live replies; a conversation that differs is never answered from the
// journal; the journal survives prune and gc for the kept checkpoints.
func TestLLMProxyDaemon(t *testing.T) {
	home, roots := llmHome(t, "a", "b")
	up1, up2 := newLLMStub(t, "one"), newLLMStub(t, "two")
	// A URL with credentials is refused, before anything is made.
	if _, errs, code := cliRun(t, home, "sandbox", "create", "c", "--base", roots["a"], "--llm-upstream", "http://u:secret@127.0.0.1:1"); code != exitUsage || strings.Contains(errs, "secret") {
		t.Fatalf("create with a credentialed upstream: exit %d: %s", code, errs)
	}
	// The proxy listens on loopback only.
	if _, errs, code := cliRun(t, home, "serve", "--llm-listen", "0.0.0.0:0"); code != exitUsage || !strings.Contains(errs, "loopback") {
		t.Fatalf("serve --llm-listen 0.0.0.0: exit %d: %s", code, errs)
	}
	d := startDaemon(t, home, nil, "--llm-listen", "127.0.0.1:0", "--llm-upstream", up1.srv.URL)
	base := filepath.Join(filepath.Dir(home), "base")
	var created struct{ Root string }
	out, _ := mustCLI(t, home, "sandbox", "create", "c", "--base", base, "--llm-upstream", up2.srv.URL+"/", "--json")
	json.Unmarshal([]byte(out), &created)
	roots["c"] = created.Root
	t.Cleanup(func() { cliRun(t, home, "sandbox", "rm", "c") })
	st := llmStatus(t, d)
	if !st.Proxy || st.Gate != "local" {
		t.Fatalf("GET /v1/llm: %+v", st)
	}
	if out, _ := mustCLI(t, home, "llm"); !strings.Contains(out, st.URL+"/llm/{sandbox}/") || !strings.Contains(out, up2.srv.URL) {
		t.Fatalf("turnsnap llm:\n%s", out)
	}
	for _, s := range st.Sandboxes {
		if (s.Name == "c") != (s.Upstream != "") {
			t.Fatalf("sandbox %s upstream %q", s.Name, s.Upstream)
		}
	}

	agents := map[string]*llmAgent{
		"a": {t: t, route: routeOf(t, st, "a"), root: roots["a"], opening: "fix the bug"},
		"b": {t: t, route: routeOf(t, st, "b"), root: roots["b"], anthropic: true, stream: true, opening: "write the docs"},
		"c": {t: t, route: routeOf(t, st, "c"), root: roots["c"], stream: true, opening: "add a test"},
	}
	first := map[string][]llmCall{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, ag := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 4; i++ {
				c := ag.step(i)
				if c.status != 200 || c.replay {
					t.Errorf("sandbox %s call %d: status %d replay %v: %s", name, i, c.status, c.replay, c.raw)
				}
				mu.Lock()
				first[name] = append(first[name], c)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if n1, n2 := up1.calls.Load(), up2.calls.Load(); n1 != 8 || n2 != 4 {
		t.Fatalf("upstream calls: default %d (want 8), c's own %d (want 4)", n1, n2)
	}
	if !strings.HasPrefix(first["c"][0].text, "two ") || !strings.HasPrefix(first["a"][0].text, "one ") {
		t.Fatalf("replies from the wrong upstream: a %q, c %q", first["a"][0].text, first["c"][0].text)
	}
	for name := range agents {
		turns := modelTurns(t, d, name)
		for k := 0; k < 4; k++ {
			if _, ok := turns[k]; !ok {
				t.Fatalf("sandbox %s: no model-call checkpoint of turn %d: %+v", name, k, turns)
			}
		}
		logOut, _ := mustCLI(t, home, "log", name)
		if n := strings.Count(logOut, "model call "); n != 4 {
			t.Fatalf("turnsnap log %s shows %d model calls:\n%s", name, n, logOut)
		}
		if !strings.Contains(logOut, "model call "+turns[3].Conv.String()[:8]) {
			t.Fatalf("turnsnap log %s lacks turn 3's conversation:\n%s", name, logOut)
		}
	}

	// Rollback to turn 2, then an agent replaying its conversation from the
	// start: calls 0 and 1 from the journal, byte for byte, 2 and 3 live.
	replay := func(name string, ag *llmAgent, want int) {
		t.Helper()
		turns := modelTurns(t, d, name)
		mustCLI(t, home, "rollback", name, turns[2].ID.String())
		if _, err := os.Stat(filepath.Join(roots[name], "tool2")); err != nil {
			t.Fatalf("sandbox %s: turn 2's tool output is not in the restored state: %v", name, err)
		}
		if _, err := os.Stat(filepath.Join(roots[name], "tool3")); !os.IsNotExist(err) {
			t.Fatalf("sandbox %s: turn 3's tool output survived the rollback: %v", name, err)
		}
		up := up1
		if name == "c" {
			up = up2
		}
		before := up.calls.Load()
		again := &llmAgent{t: t, route: ag.route, anthropic: ag.anthropic, stream: ag.stream, opening: ag.opening}
		for i := 0; i < 4; i++ {
			c := again.step(i)
			if fromJournal := i < want; c.replay != fromJournal || (fromJournal && c.raw != first[name][i].raw) || (!fromJournal && c.raw == first[name][i].raw) {
				t.Fatalf("sandbox %s replayed call %d: journal %v (want %v)\n got %q\nfirst %q", name, i, c.replay, fromJournal, c.raw, first[name][i].raw)
			}
		}
		if n := up.calls.Load() - before; n != int64(4-want) {
			t.Fatalf("sandbox %s: the replay called the model %d times, want %d", name, n, 4-want)
		}
	}
	replay("a", agents["a"], 2)
	replay("b", agents["b"], 2)

	// A conversation that differs (another opening) is never answered from
	// the journal, even at position 0.
	before := up2.calls.Load()
	other := &llmAgent{t: t, route: agents["c"].route, stream: true, opening: "add a test, please"}
	for i := 0; i < 2; i++ {
		if c := other.step(i); c.replay || c.status != 200 {
			t.Fatalf("diverging call %d answered from the journal (%v) or failed (%d)", i, c.replay, c.status)
		}
	}
	if n := up2.calls.Load() - before; n != 2 {
		t.Fatalf("a diverging conversation called the model %d times, want 2", n)
	}

	// Prune (keep the newest 3 of each sandbox) and gc with no grace: the
	// kept checkpoints keep their journals. Turn 2 verifies (its journal
	// tree is one of its roots) and a rollback to it replays again.
	mustCLI(t, home, "prune", "--keep-last", "3")
	mustCLI(t, home, "gc", "--grace", "0s")
	turns := modelTurns(t, d, "a")
	if _, err := d.client(t).Verify(context.Background(), turns[2].ID.String()); err != nil {
		t.Fatalf("verify of a journaled checkpoint after gc: %v", err)
	}
	replay("a", agents["a"], 2)
	// Every record, journal trees included, passes the store-only check.
	mustCLI(t, home, "verify", "--store-only")

	// A removed sandbox takes its upstream along: a new sandbox of the
	// name starts on the default.
	mustCLI(t, home, "sandbox", "rm", "c")
	mustCLI(t, home, "sandbox", "create", "c", "--base", base)
	for _, s := range llmStatus(t, d).Sandboxes {
		if s.Name == "c" && s.Upstream != "" {
			t.Fatalf("the new sandbox c inherited upstream %q", s.Upstream)
		}
	}
}
