package llmproxy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
)

// journalTurns is the seam as the daemon implements it: an engine
// checkpoint per turn whose record references the journal as it stands.
type journalTurns struct {
	engineTurns
	j    *StoreJournal
	mu   sync.Mutex
	refs map[delta.ID][]delta.ID // checkpoint → journal entries it references
	turn map[int]delta.ID        // turn → checkpoint
}

func (jt *journalTurns) Checkpoint(ctx context.Context, t Turn) (Committed, error) {
	refs := jt.j.Refs(t.Sandbox)
	c, err := jt.engineTurns.Checkpoint(ctx, t)
	if err == nil {
		jt.mu.Lock()
		jt.refs[c.ID], jt.turn[t.Number] = refs, c.ID
		jt.mu.Unlock()
	}
	return c, err
}

// The real path below the daemon: a real overlay sandbox, engine
// checkpoints taken by the proxy during the model's latency, the journal in
// the engine's own object store, then an engine rollback to turn 2 and an
// agent that replays its conversation from the start. Needs root and
// overlayfs.
func TestEngineTurnsRollbackReplay(t *testing.T) {
	ctx := context.Background()
	e, agentTurn := fsTurnEngine(t)
	j, err := NewStoreJournal(e.Store())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	fs := 0
	jt := &journalTurns{engineTurns: engineTurns{e: e, mu: &mu, fs: &fs}, j: j, refs: map[delta.ID][]delta.ID{}, turn: map[int]delta.ID{}}
	up := newStub(t)
	p, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: jt, Journal: j})
	url := base + "/llm/bench/v1/chat/completions"
	first := &agent{t: t, url: url, opening: "add the feature"}
	var orig []call
	for i := 0; i < 4; i++ {
		agentTurn(i) // the tool calls of the reply before
		orig = append(orig, first.step())
	}
	waitIdle(p)
	log, err := e.History().Log(ctx, "bench")
	if err != nil {
		t.Fatal(err)
	}
	if len(log) != 5 || fs != 4 {
		t.Fatalf("%d log entries (%d fs checkpoints), want the base and 4 fs turns", len(log), fs)
	}
	if !strings.HasPrefix(log[0].Checkpoint.Message, "llm call ") || log[0].Checkpoint.Turn != 3 {
		t.Fatalf("newest checkpoint: turn %d message %q", log[0].Checkpoint.Turn, log[0].Checkpoint.Message)
	}
	id2 := jt.turn[2]
	if _, err := e.Rollback(ctx, "bench", mustRef(id2.String()), engine.RollbackOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := j.Reset(ctx, "bench", jt.refs[id2]); err != nil {
		t.Fatal(err)
	}
	root, err := e.SandboxPath(ctx, "bench")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "work", "turn2")); err != nil {
		t.Fatalf("turn 2's files are not in the restored state: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "work", "turn3")); !os.IsNotExist(err) {
		t.Fatalf("turn 3's files survived the rollback: %v", err)
	}
	calls := up.calls.Load()
	again := &agent{t: t, url: url, opening: "add the feature"}
	for i := 0; i < 3; i++ {
		c := again.step()
		if want := i < 2; c.journal != want || (want && c.raw != orig[i].raw) {
			t.Fatalf("replayed call %d: journal %v (want %v), reply %q", i, c.journal, want, c.reply)
		}
	}
	if n := up.calls.Load() - calls; n != 1 {
		t.Fatalf("the replay called the model %d times, want once (turn 2, live)", n)
	}
}
