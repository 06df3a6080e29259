package llmproxy

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
)

// treeTurns is the daemon's use of a TreeJournal (server/llm.go):
// each checkpoint saves the snapshot of the earlier turns' exchanges and
// commits it, and the journal root each turn's checkpoint references is
// kept for a rollback to restore.
type treeTurns struct {
	j     *TreeJournal
	blobs *lockedBlobs
	mu    sync.Mutex
	roots map[int]*delta.ID // turn → its checkpoint's journal root
}

func newTreeTurns() *treeTurns {
	b := &lockedBlobs{m: memBlobs{}}
	return &treeTurns{j: NewTreeJournal(delta.IDs{}, b), blobs: b, roots: map[int]*delta.ID{}}
}

func (tt *treeTurns) Checkpoint(ctx context.Context, t Turn) (Committed, error) {
	snap := tt.j.Snapshot(t.Sandbox, t.Number)
	root, err := snap.Save(ctx, tt.blobs)
	if err != nil {
		return Committed{}, err
	}
	tt.j.Committed(ctx, snap)
	tt.mu.Lock()
	tt.roots[t.Number] = root
	tt.mu.Unlock()
	return Committed{ID: t.Conv, Class: "fs"}, nil
}

func (tt *treeTurns) WaitRemote(context.Context, Turn, Committed) error { return nil }

func (tt *treeTurns) root(turn int) *delta.ID {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	return tt.roots[turn]
}

// lockedBlobs is memBlobs safe for the proxy's concurrent checkpoints and
// reads.
type lockedBlobs struct {
	mu sync.Mutex
	m  memBlobs
}

func (l *lockedBlobs) SaveBlob(ctx context.Context, t delta.BlobType, id delta.ID, b []byte) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m.SaveBlob(ctx, t, id, b)
}

func (l *lockedBlobs) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m.LoadBlob(ctx, t, id)
}

// sampled is an OpenAI chat call sampling at temperature 1.0 after the
// given assistant replies.
func sampled(replies ...string) string {
	msgs := []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": "start"}}
	for i, r := range replies {
		msgs = append(msgs, map[string]any{"role": "assistant", "content": r},
			map[string]any{"role": "user", "content": fmt.Sprintf("tool result %d", i)})
	}
	b, _ := json.Marshal(map[string]any{"model": "gpt-test", "messages": msgs, "temperature": 1.0})
	return string(b)
}

// Issue 24 A: the same call three times on a live timeline (a retry after
// a bad answer, best-of-n sampling) reaches the model three times and gets
// three replies; the journal answers a live call only on explicit opt-in
// (X-Turnsnap-Journal: replay), and that header never reaches the model.
func TestLiveRetriesReachTheModel(t *testing.T) {
	up := newStub(t)
	tt := newTreeTurns()
	p, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: tt, Journal: tt.j})
	url := base + "/llm/fresh/v1/chat/completions"
	body := sampled()
	seen := map[string]bool{}
	for i := 0; i < 3; i++ {
		s, h, b := post(t, url, body, nil)
		if s != 200 || h.Get(ReplayHeader) != "" {
			t.Fatalf("call %d: status %d, %s %q: %s", i, s, ReplayHeader, h.Get(ReplayHeader), b)
		}
		if seen[b] {
			t.Fatalf("call %d got an earlier call's reply %s", i, b)
		}
		seen[b] = true
	}
	if n := up.calls.Load(); n != 3 {
		t.Fatalf("the model answered %d of 3 calls", n)
	}
	waitIdle(p)
	if tt.j.Empty("fresh") {
		t.Fatal("the live exchanges were not recorded")
	}
	// The opt-in answers from the journal: the last reply recorded.
	s, h, b := post(t, url, body, map[string]string{ReplayHeader: "replay"})
	if s != 200 || h.Get(ReplayHeader) != "replay" || !strings.Contains(b, "live #3") {
		t.Fatalf("opt-in replay: %d %q %s", s, h.Get(ReplayHeader), b)
	}
	if n := up.calls.Load(); n != 3 {
		t.Fatalf("the opted-in replay called the model (%d calls)", n)
	}
	// A live call with the header "off" or "auto" reaches the model, without it.
	for _, v := range []string{"off", "auto"} {
		if s, h, b := post(t, url, body, map[string]string{ReplayHeader: v}); s != 200 || h.Get(ReplayHeader) != "" {
			t.Fatalf("header %s: %d %q %s", v, s, h.Get(ReplayHeader), b)
		}
	}
	for _, r := range up.requests() {
		if r.Header.Get(ReplayHeader) != "" {
			t.Fatalf("the model saw the proxy's header %s: %q", ReplayHeader, r.Header.Get(ReplayHeader))
		}
	}
	if s, _, b := post(t, url, body, map[string]string{ReplayHeader: "sometimes"}); s != 400 {
		t.Fatalf("a bad %s header: %d %s", ReplayHeader, s, b)
	}
	if n := up.calls.Load(); n != 5 {
		t.Fatalf("the model answered %d calls, want 5", n)
	}
}

// Issue 24 A, the other side: after a rollback to the checkpoint of turn 2
// an agent re-run from the start gets the exchanges that checkpoint holds,
// each once and byte for byte, until its first call that goes to the model
// (it caught up with the restored state, or diverged); then its timeline is
// live again and a repeated call reaches the model. A sandbox set to off,
// or a call with the header off, is never answered from the journal.
func TestRerunAfterRollbackReplays(t *testing.T) {
	ctx := context.Background()
	up := newStub(t)
	tt := newTreeTurns()
	var mu sync.Mutex
	setting := ReplayAuto
	p, base := newProxy(t, Options{Upstream: up.srv.URL, Turns: tt, Journal: tt.j,
		ReplayFor: func(context.Context, string) (Replay, error) {
			mu.Lock()
			defer mu.Unlock()
			return setting, nil
		}})
	url := base + "/llm/agent/v1/chat/completions"
	var replies, raw []string
	for i := 0; i < 4; i++ {
		s, h, b := post(t, url, sampled(replies...), nil)
		if s != 200 || h.Get(ReplayHeader) != "" {
			t.Fatalf("first run, call %d: %d %q %s", i, s, h.Get(ReplayHeader), b)
		}
		raw = append(raw, b)
		replies = append(replies, fmt.Sprintf("live #%d", i+1))
	}
	waitIdle(p)
	root := tt.root(2)
	if root == nil {
		t.Fatal("no journal at turn 2's checkpoint")
	}
	rollback := func() {
		t.Helper()
		if err := tt.j.Reset(ctx, "agent", root); err != nil {
			t.Fatal(err)
		}
	}
	type step struct {
		body   string
		hdr    map[string]string
		replay int // the first run's call it replays, or -1: live
	}
	run := func(name string, steps []step) {
		t.Helper()
		for i, st := range steps {
			calls := up.calls.Load()
			s, h, b := post(t, url, st.body, st.hdr)
			if s != 200 {
				t.Fatalf("%s, step %d: status %d %s", name, i, s, b)
			}
			fromJournal := h.Get(ReplayHeader) == "replay"
			switch {
			case st.replay >= 0 && (!fromJournal || b != raw[st.replay] || up.calls.Load() != calls):
				t.Fatalf("%s, step %d: want call %d's reply from the journal, got journal %v %s", name, i, st.replay, fromJournal, b)
			case st.replay < 0 && (fromJournal || up.calls.Load() != calls+1):
				t.Fatalf("%s, step %d: want a live reply, got journal %v %s", name, i, fromJournal, b)
			}
		}
	}
	rollback()
	run("re-run catching up", []step{
		{sampled(), nil, 0},
		{sampled(replies[:1]...), nil, 1},
		{sampled(replies[:2]...), nil, -1}, // turn 2: the restored state has not acted on it
		{sampled(), nil, -1},               // live again: a repeat reaches the model
	})
	rollback()
	run("re-run repeating a call", []step{
		{sampled(), nil, 0},
		{sampled(), nil, -1},               // each exchange answers once
		{sampled(replies[:1]...), nil, -1}, // and the re-run is over
	})
	rollback()
	run("re-run diverging", []step{
		{sampled(), nil, 0},
		{sampled("something else"), nil, -1},
		{sampled(replies[:1]...), nil, -1},
	})
	rollback()
	run("header off", []step{
		{sampled(), map[string]string{ReplayHeader: "off"}, -1},
		{sampled(replies[:1]...), nil, -1},
	})
	mu.Lock()
	setting = ReplayOff
	mu.Unlock()
	rollback()
	run("sandbox set to off", []step{
		{sampled(), nil, -1},
		{sampled(), map[string]string{ReplayHeader: "replay"}, -1},
	})
}
