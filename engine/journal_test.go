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
		last, err = e.Resolve(ctx, r.ID.String())
		must(t, err)
		if last.Version != delta.RecordVersionLLM || last.Journal == nil || *last.Conv != conv {
			t.Fatalf("turn %d: version %d journal %v conv %v", turn, last.Version, last.Journal, last.Conv)
		}
	}
	write(t, filepath.Join(res.Root, "plain"), "a turn with no model call\n")
	r, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	plain, err := e.Resolve(ctx, r.ID.String())
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
