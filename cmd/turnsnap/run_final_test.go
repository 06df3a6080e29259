package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// turnsnap run closes the agent's last turn when it exits: what its tools
// did after its last model call is a checkpoint of its own (issue 24's
// "run takes a final checkpoint when the agent exits"), unless
// --no-final-checkpoint; an agent that changed nothing adds no checkpoint.
func TestLLMRunFinalCheckpoint(t *testing.T) {
	home, roots := llmHome(t, "s")
	up := newLLMStub(t, "up")
	d := startDaemon(t, home, nil, "--llm-listen", "127.0.0.1:0", "--llm-upstream", up.srv.URL)
	c := d.client(t)
	ctx := context.Background()
	head := func() string {
		log, err := c.Log(ctx, "s")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range log {
			if l.Head {
				return l.ID.String()
			}
		}
		t.Fatal("no head")
		return ""
	}
	before := head()
	_, errs, code := cliRun(t, home, "run", "s", "--", "sh", "-c", `echo after > "$TURNSNAP_ROOT/after.txt"; exit 3`)
	if code != 3 || !strings.Contains(errs, "final checkpoint") || !strings.Contains(errs, "status 3") {
		t.Fatalf("run: exit %d (want the agent's 3), stderr %s", code, errs)
	}
	after := head()
	if after == before {
		t.Fatal("run took no final checkpoint")
	}
	out, _ := mustCLI(t, home, "cat", after, "/after.txt")
	if out != "after\n" {
		t.Fatalf("final checkpoint holds after.txt = %q", out)
	}
	log, err := c.Log(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log[0].Message, "agent exited (status 3)") {
		t.Fatalf("final checkpoint's message %q", log[0].Message)
	}
	// Nothing changed: no new checkpoint.
	_, errs, code = cliRun(t, home, "run", "s", "--", "true")
	if code != 0 || head() != after || !strings.Contains(errs, "nothing changed") {
		t.Fatalf("run of an agent that changed nothing: exit %d, head moved %v: %s", code, head() != after, errs)
	}
	// Opted out: the change stays uncheckpointed.
	os.Remove(filepath.Join(roots["s"], "after.txt"))
	_, errs, code = cliRun(t, home, "run", "s", "--no-final-checkpoint", "--", "true")
	if code != 0 || head() != after || strings.Contains(errs, "final checkpoint") {
		t.Fatalf("run --no-final-checkpoint: exit %d, head moved %v: %s", code, head() != after, errs)
	}
}
