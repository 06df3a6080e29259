package engine

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/retention"
	"github.com/turnsnap/turnsnap/llmproxy"
)

// A model-call journal is one of the checkpoint's roots: it is stored with
// the turn, carried forward by a turn without one, counted like any tree
// (refcounts equal a recount), and survives prune, gc and a catalog rebuild
// for the checkpoints kept. Records with it are version 3; others stay 2.
func TestJournalFollowsCheckpoint(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	base := filepath.Join(t.TempDir(), "base")
	must(t, os.MkdirAll(base, 0o755))
	write(t, filepath.Join(base, "README"), "repo\n")
	res, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: base})
	must(t, err)
	if res.Checkpoint.Version != delta.RecordVersion {
		t.Fatalf("a new sandbox's record is version %d", res.Checkpoint.Version)
	}
	j := llmproxy.NewTreeJournal(delta.IDs{}, e.Blobs())
	big := bytes.Repeat([]byte("exchange "), 40000)
	var last *delta.Checkpoint
	for turn := 0; turn < 3; turn++ {
		must(t, j.Put(ctx, "s", &llmproxy.Entry{Conv: delta.Hash([]byte(fmt.Sprint(turn))), Turn: turn,
			Shape: llmproxy.ShapeChat, Status: 200, Request: []byte("{}"), Response: append([]byte(fmt.Sprint(turn)), big...)}))
		write(t, filepath.Join(res.Root, fmt.Sprint("f", turn)), "tool output\n")
		snap := j.Snapshot("s", turn+1)
		conv := delta.Hash([]byte(fmt.Sprint("call ", turn)))
		r, err := e.Checkpoint(ctx, "s", CheckpointOptions{Conv: &conv, Journal: snap.Save})
		must(t, err)
		j.Committed(ctx, snap)
		last, err = e.Resolve(ctx, mustRef(r.ID.String()))
		must(t, err)
		if last.Version != delta.RecordVersionLLM || last.Journal == nil || *last.Conv != conv {
			t.Fatalf("turn %d: version %d journal %v conv %v", turn, last.Version, last.Journal, last.Conv)
		}
	}
	write(t, filepath.Join(res.Root, "plain"), "a turn with no model call\n")
	r, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	plain, err := e.Resolve(ctx, mustRef(r.ID.String()))
	must(t, err)
	if plain.Journal == nil || *plain.Journal != *last.Journal || plain.Conv != nil {
		t.Fatalf("a turn without a model call: journal %v (want %v carried), conv %v", plain.Journal, last.Journal, plain.Conv)
	}
	checkAll(t, e)
	_, err = e.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 1})
	must(t, err)
	_, err = e.Retention().GC(ctx, retention.GCOptions{})
	must(t, err)
	checkAll(t, e)
	_, err = e.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	checkAll(t, e)
	// The journal reads back from the store after all that.
	fresh := llmproxy.NewTreeJournal(delta.IDs{}, e.Blobs())
	must(t, fresh.Reset(ctx, "s", plain.Journal))
	for turn := 0; turn < 3; turn++ {
		got, err := fresh.Get(ctx, "s", delta.Hash([]byte(fmt.Sprint(turn))))
		must(t, err)
		if got == nil || !bytes.Equal(got.Response, append([]byte(fmt.Sprint(turn)), big...)) {
			t.Fatalf("entry of turn %d lost or changed", turn)
		}
	}
}

// A skip record restores exactly as its parent does, the model-call journal
// included: it carries the parent's journal (and so is version 3), a turn
// after it carries it on, and a rollback to it gives the LLM proxy the
// parent's journal to replay (server: LLM.restored resets the journal to
// the head's). Before, the record dropped it, and the rollback replayed
// nothing.
func TestSkipRecordKeepsJournal(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr := smallSandbox(t, e, "s")
	j := llmproxy.NewTreeJournal(delta.IDs{}, e.Blobs())
	conv := delta.Hash([]byte("the conversation"))
	reply := []byte(`{"choices":[{"message":{"content":"one"}}]}`)
	must(t, j.Put(ctx, "s", &llmproxy.Entry{Conv: conv, Turn: 0, Shape: llmproxy.ShapeChat, Status: 200,
		Request: []byte("{}"), Response: reply}))
	write(t, filepath.Join(cr.Root, "tool.txt"), "tool output\n")
	snap := j.Snapshot("s", 1)
	r1, err := e.Checkpoint(ctx, "s", CheckpointOptions{Conv: &conv, Journal: snap.Save})
	must(t, err)
	j.Committed(ctx, snap)
	parent, err := e.Resolve(ctx, mustRef(r1.ID.String()))
	must(t, err)
	sr, err := e.Checkpoint(ctx, "s", CheckpointOptions{RecordSkips: true})
	must(t, err)
	if sr.Class != delta.ClassSkip || sr.ID == r1.ID {
		t.Fatalf("the unchanged turn: class %s, id %s (parent %s); the test needs a skip record", sr.Class, sr.ID.Short(), r1.ID.Short())
	}
	skip, err := e.Resolve(ctx, mustRef(sr.ID.String()))
	must(t, err)
	if skip.Journal == nil || *skip.Journal != *parent.Journal || skip.Version != delta.RecordVersionLLM || skip.Conv != nil {
		t.Fatalf("skip record: version %d, journal %v, conv %v; want version %d and its parent's journal %v, no conv",
			skip.Version, skip.Journal, skip.Conv, delta.RecordVersionLLM, parent.Journal)
	}
	write(t, filepath.Join(cr.Root, "later.txt"), "a turn with no model call\n")
	r3, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	after, err := e.Resolve(ctx, mustRef(r3.ID.String()))
	must(t, err)
	if after.Journal == nil || *after.Journal != *parent.Journal {
		t.Fatalf("the turn after the skip record: journal %v, want %v carried", after.Journal, parent.Journal)
	}
	_, err = e.Rollback(ctx, "s", mustRef(sr.ID.String()), RollbackOptions{})
	must(t, err)
	log, err := e.History().Log(ctx, "s")
	must(t, err)
	var head *delta.Checkpoint
	for _, le := range log {
		if le.Head {
			head = le.Checkpoint
		}
	}
	if head == nil || head.ID != sr.ID || head.Journal == nil {
		t.Fatalf("after the rollback to the skip record the head is %v", head)
	}
	// What the proxy does after a rollback: its journal becomes the head's,
	// and the exchange the parent held is there to replay.
	fresh := llmproxy.NewTreeJournal(delta.IDs{}, e.Blobs())
	must(t, fresh.Reset(ctx, "s", head.Journal))
	got, err := fresh.Get(ctx, "s", conv)
	must(t, err)
	if got == nil || !bytes.Equal(got.Response, reply) {
		t.Fatalf("after a rollback to the skip record the journal answers %v, want its parent's exchange", got)
	}
	checkAll(t, e)
	_, err = e.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 1})
	must(t, err)
	_, err = e.Retention().GC(ctx, retention.GCOptions{})
	must(t, err)
	checkAll(t, e)
}
