package main

import (
	"context"
	"testing"

	"github.com/turnsnap/turnsnap/api"
)

// Issue 24 A through a real daemon: on a fresh sandbox's live timeline the
// same call sent three times reaches the model three times (a retry or
// best-of-n sampling is never answered with the first reply); a re-run
// after a rollback replays the restored turns once each, then is live; the
// per-sandbox setting llm_replay off turns replay off and auto back on.
func TestLLMLiveRetriesAndReplaySetting(t *testing.T) {
	home, roots := llmHome(t, "r")
	up := newLLMStub(t, "up")
	d := startDaemon(t, home, nil, "--llm-listen", "127.0.0.1:0", "--llm-upstream", up.srv.URL)
	route := routeOf(t, llmStatus(t, d), "r")
	ag := &llmAgent{t: t, route: route, root: roots["r"], opening: "fix the bug"}
	var firstRun []llmCall
	for k := 0; k < 3; k++ {
		ag.msgs = nil // the same first call again
		c := ag.step(0)
		if c.status != 200 || c.replay {
			t.Fatalf("live call, attempt %d: status %d replay %v: %s", k, c.status, c.replay, c.raw)
		}
		for _, f := range firstRun {
			if f.raw == c.raw {
				t.Fatalf("attempt %d got an earlier attempt's reply %s", k, c.raw)
			}
		}
		firstRun = append(firstRun, c)
	}
	if n := up.calls.Load(); n != 3 {
		t.Fatalf("the model answered %d of 3 attempts", n)
	}
	orig := []llmCall{firstRun[2]}
	for i := 1; i < 4; i++ {
		orig = append(orig, ag.step(i))
	}
	turns := modelTurns(t, d, "r")
	ctx := context.Background()
	set := func(v string) {
		t.Helper()
		out, err := d.client(t).SetLLMUpstream(ctx, "r", api.LLMUpstreamRequest{LLMReplay: &v})
		if err != nil {
			t.Fatal(err)
		}
		if want := map[string]string{"off": "off", "auto": ""}[v]; out.Replay != want {
			t.Fatalf("llm_replay %s: the sandbox shows %q", v, out.Replay)
		}
	}
	rerun := func(replayed int) {
		t.Helper()
		mustCLI(t, home, "rollback", "r", turns[2].ID.String())
		before := up.calls.Load()
		again := &llmAgent{t: t, route: route, opening: "fix the bug"}
		for i := 0; i < 3; i++ {
			c := again.step(i)
			if want := i < replayed; c.status != 200 || c.replay != want || (want && c.raw != orig[i].raw) {
				t.Fatalf("re-run call %d: status %d journal %v (want %v): %s", i, c.status, c.replay, want, c.raw)
			}
		}
		// The re-run caught up: the same call again is live.
		again.msgs = again.msgs[:len(again.msgs)-2]
		if c := again.step(2); c.replay {
			t.Fatalf("a repeat after the re-run caught up was answered from the journal: %s", c.raw)
		}
		if n := up.calls.Load() - before; n != int64(4-replayed) {
			t.Fatalf("the re-run called the model %d times, want %d", n, 4-replayed)
		}
	}
	set("off")
	for _, s := range llmStatus(t, d).Sandboxes {
		if s.Name == "r" && s.Replay != "off" {
			t.Fatalf("GET /v1/llm shows replay %q for r", s.Replay)
		}
	}
	rerun(0)
	set("auto")
	rerun(2)
	bad := "sometimes"
	if _, err := d.client(t).SetLLMUpstream(ctx, "r", api.LLMUpstreamRequest{LLMReplay: &bad}); err == nil {
		t.Fatal("llm_replay sometimes was accepted")
	}
}
