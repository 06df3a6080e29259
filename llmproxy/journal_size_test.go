package llmproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
)

// countingBlobs is a blob store that counts the bytes of the blobs it
// stores for the first time: what a checkpoint adds to the store.
type countingBlobs struct {
	lockedBlobs
	added atomic.Int64
}

func (c *countingBlobs) SaveBlob(ctx context.Context, t delta.BlobType, id delta.ID, b []byte) (bool, error) {
	fresh, err := c.lockedBlobs.SaveBlob(ctx, t, id, b)
	if fresh {
		c.added.Add(int64(len(b)))
	}
	return fresh, err
}

// sizeTurns takes a checkpoint per model call as the daemon does
// (server/llm.go) and measures, per checkpoint, the journal bytes it
// added to the store. Beside it, in the same run, it stores the same
// exchanges as the journal did before deltas and chains (every entry whole
// in a flat tree of all entries, legacySave): the baseline.
type sizeTurns struct {
	j      *TreeJournal
	blobs  *countingBlobs
	legacy *countingBlobs
	mu     sync.Mutex
	roots  []*delta.ID
	added  []int64 // journal bytes added by each checkpoint, in order
	old    []int64 // the same, stored the old way
	flat   map[delta.ID]delta.Entry
}

func newSizeTurns() *sizeTurns {
	b := &countingBlobs{lockedBlobs: lockedBlobs{m: memBlobs{}}}
	return &sizeTurns{j: NewTreeJournal(delta.IDs{}, b), blobs: b,
		legacy: &countingBlobs{lockedBlobs: lockedBlobs{m: memBlobs{}}}, flat: map[delta.ID]delta.Entry{}}
}

func (st *sizeTurns) Checkpoint(ctx context.Context, t Turn) (Committed, error) {
	snap := st.j.Snapshot(t.Sandbox, t.Number)
	st.mu.Lock()
	defer st.mu.Unlock()
	before := st.blobs.added.Load()
	root, err := snap.Save(ctx, st.blobs)
	if err != nil {
		return Committed{}, err
	}
	st.j.Committed(ctx, snap)
	st.roots = append(st.roots, root)
	st.added = append(st.added, st.blobs.added.Load()-before)
	n, err := st.legacySave(ctx, snap)
	if err != nil {
		return Committed{}, err
	}
	st.old = append(st.old, n)
	return Committed{ID: t.Conv, Class: "fs"}, nil
}

func (st *sizeTurns) WaitRemote(context.Context, Turn, Committed) error { return nil }

// legacySave stores the snapshot as the journal did before deltas: each
// new entry whole ("TSJ1"), cut as a file, then one flat tree of every
// entry of the journal. It returns the bytes it added.
func (st *sizeTurns) legacySave(ctx context.Context, snap *Snapshot) (int64, error) {
	before := st.legacy.added.Load()
	for _, se := range snap.entries {
		plain, err := encodeEntry(se.e)
		if err != nil {
			return 0, err
		}
		f := delta.Entry{Name: journalFileName(se.e.Conv, se.e.Turn), Type: delta.TypeFile, Mode: 0o600, Size: uint64(len(plain))}
		if err := delta.ChunkReader(bytes.NewReader(plain), func(c []byte) error {
			id := delta.Hash(c)
			f.Chunks = append(f.Chunks, id)
			_, err := st.legacy.SaveBlob(ctx, delta.BlobData, id, c)
			return err
		}); err != nil {
			return 0, err
		}
		st.flat[se.e.Conv] = f
	}
	t := &delta.Tree{}
	for _, f := range st.flat {
		t.Entries = append(t.Entries, f)
	}
	t.Sort()
	enc := t.Encode()
	if _, err := st.legacy.SaveBlob(ctx, delta.BlobTree, delta.Hash(enc), enc); err != nil {
		return 0, err
	}
	return st.legacy.added.Load() - before, nil
}

// codingModel is a scripted model upstream on 127.0.0.1 that answers every
// chat call with a coding agent's tool call: a one-line edit and a few
// hundred bytes of reasoning, different on each call.
func codingModel(t testing.TB) *httptest.Server {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		i := n.Add(1)
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		args, _ := json.Marshal(map[string]string{"path": fmt.Sprintf("pkg/mod%d/file%d.go", i%17, i%5),
			"old": "return nil", "new": fmt.Sprintf("return fmt.Errorf(\"step %d: %%w\", err)", i)})
		reply := map[string]any{
			"id": fmt.Sprintf("chatcmpl-%d", i), "object": "chat.completion", "created": 1733500000 + i, "model": "gpt-test",
			"choices": []any{map[string]any{"index": 0, "finish_reason": "tool_calls", "message": map[string]any{
				"role": "assistant", "content": words(rng, 60),
				"tool_calls": []any{map[string]any{"id": fmt.Sprintf("call_%d", i), "type": "function",
					"function": map[string]any{"name": "edit_file", "arguments": string(args)}}},
			}}},
			"usage": map[string]any{"prompt_tokens": 9000 + 700*i, "completion_tokens": 120, "total_tokens": 9120 + 700*i},
		}
		b, _ := json.Marshal(reply)
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// words is n pseudo-random words of source-code prose.
func words(rng *rand.Rand, n int) string {
	vocab := strings.Fields("the func return err nil if for range struct type interface error context ctx value " +
		"test file path read write handler request reply journal turn sandbox checkpoint call model tool edit " +
		"line package import string int bytes buffer map slice len cap append make new go defer")
	var sb strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(vocab[rng.IntN(len(vocab))])
	}
	return sb.String()
}

// codingAgent is a coding agent's conversation of realistic size: a 20 KB
// system prompt and a 10 KB tool list sent with every call, then per turn
// the model's tool call (as the model sent it) and the tool's result, a
// kilobyte or two of file content.
type codingAgent struct {
	t      testing.TB
	url    string
	rng    *rand.Rand
	system string
	tools  []any
	msgs   []any
	bodies []string // the request of each call
	raw    []string // the reply to each call, as received
	new    []int    // the bytes each call's request and reply added: appended messages and the reply
}

func newCodingAgent(t testing.TB, url string) *codingAgent {
	a := &codingAgent{t: t, url: url, rng: rand.New(rand.NewPCG(1, 2))}
	a.system = "You are a coding agent working in a repository. " + words(a.rng, 3300) // ~20 KB
	for i := 0; i < 12; i++ {
		a.tools = append(a.tools, map[string]any{"type": "function", "function": map[string]any{
			"name": fmt.Sprintf("tool_%d", i), "description": words(a.rng, 110),
			"parameters": map[string]any{"type": "object", "properties": map[string]any{
				"path": map[string]any{"type": "string", "description": words(a.rng, 12)},
				"args": map[string]any{"type": "string", "description": words(a.rng, 12)}}}}})
	}
	a.msgs = []any{map[string]any{"role": "system", "content": a.system},
		map[string]any{"role": "user", "content": "Make every function in pkg/ wrap its errors with the step number."}}
	return a
}

// body is the current call's request, as an OpenAI SDK lays it out.
func (a *codingAgent) body() []byte {
	b, _ := json.Marshal(struct {
		Messages    []any   `json:"messages"`
		Model       string  `json:"model"`
		Temperature float64 `json:"temperature"`
		Tools       []any   `json:"tools"`
	}{a.msgs, "gpt-test", 1.0, a.tools})
	return b
}

// call sends the conversation, keeps the reply, and appends the reply's
// message and its tool's result for the next call.
func (a *codingAgent) call(hdr map[string]string) (raw string, replayed bool) {
	a.t.Helper()
	body := a.body()
	s, h, b := post(a.t, a.url, string(body), hdr)
	if s != 200 {
		a.t.Fatalf("call %d: status %d %s", len(a.bodies), s, b)
	}
	prev := 0
	if n := len(a.bodies); n > 0 {
		prev = len(a.bodies[n-1])
	}
	a.new = append(a.new, len(body)-prev+len(b))
	a.bodies, a.raw = append(a.bodies, string(body)), append(a.raw, b)
	var reply struct {
		Choices []struct {
			Message map[string]any `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(b), &reply); err != nil || len(reply.Choices) == 0 {
		a.t.Fatalf("call %d: reply %q: %v", len(a.bodies)-1, b, err)
	}
	a.msgs = append(a.msgs, reply.Choices[0].Message, map[string]any{"role": "tool",
		"tool_call_id": fmt.Sprintf("call_%d", len(a.bodies)), "content": words(a.rng, 150+a.rng.IntN(250))})
	return b, h.Get(ReplayHeader) == "replay"
}

// journalRun runs a coding agent's conversation of turns model calls
// through the proxy over real HTTP, a checkpoint per call, and returns the
// journal's measurements and the agent.
func journalRun(t testing.TB, turns int) (*sizeTurns, *codingAgent, *Proxy) {
	st := newSizeTurns()
	p, base := newProxy(t, Options{Upstream: codingModel(t).URL, Turns: st, Journal: st.j})
	a := newCodingAgent(t, base+"/llm/coder/v1/chat/completions")
	for i := 0; i < turns; i++ {
		a.call(nil)
	}
	waitIdle(p)
	return st, a, p
}

// perTurn is the mean of the journal bytes the checkpoints of turns 1 to
// n-1 added (each holds the exchange of the turn before; turn 0's holds
// none).
func perTurn(added []int64) float64 {
	var sum int64
	for _, n := range added[1:] {
		sum += n
	}
	return float64(sum) / float64(len(added)-1)
}

// Issue 24 B: a turn costs what it changed. A coding agent's 200-turn
// conversation (a 30 KB system prompt and tool list in every request)
// through the proxy over real HTTP: each checkpoint adds to the store at
// most the bytes its exchange added to the conversation (the appended
// messages and the reply) plus 1 KiB, where storing each request whole
// added the whole conversation every turn. Then a rollback to the last
// checkpoint and a re-run from the start gets every recorded reply byte for
// byte, and every request comes back exactly as sent, from a chain of 200
// trees and deltas.
func TestJournalTurnCostsWhatItChanged(t *testing.T) {
	const turns = 200
	st, a, _ := journalRun(t, turns)
	if len(st.added) != turns {
		t.Fatalf("%d checkpoints for %d calls", len(st.added), turns)
	}
	for k := 1; k < turns; k++ {
		// Checkpoint k stores exchange k-1.
		if limit := int64(a.new[k-1]) + 1024; st.added[k] > limit {
			t.Errorf("checkpoint of turn %d added %d journal bytes; its exchange added %d to the conversation (limit %d)",
				k, st.added[k], a.new[k-1], limit)
		}
	}
	after, before := perTurn(st.added), perTurn(st.old)
	var added, worst int64
	for k := 1; k < turns; k++ {
		added += int64(a.new[k-1])
		worst = max(worst, st.added[k]-int64(a.new[k-1]))
	}
	t.Logf("journal bytes per turn over %d turns: %.0f stored whole in a flat tree (baseline), %.0f now, for %.0f new bytes per exchange (overhead at most %d); the last request is %d bytes",
		turns, before, after, float64(added)/(turns-1), worst, len(a.bodies[turns-1]))
	if t.Failed() {
		t.FailNow()
	}

	// Restore the last checkpoint's journal in a journal that has nothing
	// in memory (a restarted daemon): every entry is read from the store.
	ctx := context.Background()
	fresh := NewTreeJournal(delta.IDs{}, st.blobs)
	root := st.roots[turns-1]
	if err := fresh.Reset(ctx, "coder", root); err != nil {
		t.Fatal(err)
	}
	// The newest entry first, cold: its request is rebuilt down a chain of
	// 198 deltas.
	last, _ := ParseRequest(ShapeChat, []byte(a.bodies[turns-2]))
	e, err := fresh.Get(ctx, "coder", last.Conv)
	if err != nil || e == nil || string(e.Request) != a.bodies[turns-2] || string(e.Response) != a.raw[turns-2] {
		t.Fatalf("entry of turn %d read cold: %v, request equal %v", turns-2, err, e != nil && string(e.Request) == a.bodies[turns-2])
	}
	p2, base := newProxy(t, Options{Upstream: codingModel(t).URL, Turns: &fakeTurns{}, Journal: fresh})
	again := newCodingAgent(t, base+"/llm/coder/v1/chat/completions")
	for i := 0; i < turns-1; i++ {
		raw, replayed := again.call(nil)
		if !replayed || raw != a.raw[i] || again.bodies[i] != a.bodies[i] {
			t.Fatalf("re-run call %d: replayed %v, reply equal %v", i, replayed, raw == a.raw[i])
		}
		r, _ := ParseRequest(ShapeChat, []byte(a.bodies[i]))
		e, err := fresh.Get(ctx, "coder", r.Conv)
		if err != nil || e == nil || string(e.Request) != a.bodies[i] {
			t.Fatalf("entry of turn %d: request not rebuilt exactly (%v)", i, err)
		}
	}
	waitIdle(p2)
}

// BenchmarkJournalBytesPerTurn: the journal bytes a checkpoint adds per
// turn of a coding agent's 200-turn conversation through the proxy
// (TestJournalTurnCostsWhatItChanged's), stored as before deltas and chains
// (every request whole in a flat tree of all entries: B/turn-before) and
// now (B/turn-after), in the same run; new-B/turn is what the exchanges
// added to the conversation.
func BenchmarkJournalBytesPerTurn(b *testing.B) {
	const turns = 200
	var before, after, fresh float64
	for i := 0; i < b.N; i++ {
		st, a, _ := journalRun(b, turns)
		before += perTurn(st.old)
		after += perTurn(st.added)
		var sum int
		for _, n := range a.new[:turns-1] {
			sum += n
		}
		fresh += float64(sum) / float64(turns-1)
	}
	n := float64(b.N)
	b.ReportMetric(before/n, "B/turn-before")
	b.ReportMetric(after/n, "B/turn-after")
	b.ReportMetric(fresh/n, "new-B/turn")
}
