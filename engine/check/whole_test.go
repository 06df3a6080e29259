package check

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// memBlobs is a blob store in memory that hashes nothing: Whole must not
// rely on the loader to notice what is missing.
type memBlobs map[delta.ID][]byte

func (m memBlobs) LoadBlob(_ context.Context, _ delta.BlobType, id delta.ID) ([]byte, error) {
	if b, ok := m[id]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("blob %s: %w", id.Short(), errdefs.ErrNotFound)
}

func (m memBlobs) tree(entries ...delta.Entry) delta.ID {
	data := (&delta.Tree{Entries: entries}).Encode()
	id := delta.Hash(data)
	m[id] = data
	return id
}

func (m memBlobs) chunk(s string) delta.ID {
	id := delta.Hash([]byte(s))
	m[id] = []byte(s)
	return id
}

func dir(name string, sub delta.ID) delta.Entry {
	return delta.Entry{Name: name, Type: delta.TypeDir, Mode: 0o755, Subtree: sub}
}

func file(name string, chunks ...delta.ID) delta.Entry {
	return delta.Entry{Name: name, Type: delta.TypeFile, Mode: 0o644, Size: uint64(6 * len(chunks)), Chunks: chunks}
}

// Whole keeps the checkpoints whose every tree and chunk is there, fails
// the others with the class of what is wrong, and counts references
// exactly as CountRefs over the whole ones once asked to recount.
func TestWholeSkipsOnlyWhatNeedsAMissingOrBadObject(t *testing.T) {
	ctx := context.Background()
	m := memBlobs{}
	shared := m.tree(file("f", m.chunk("hello\n")))
	base := m.tree(dir("shared", shared))
	good := m.tree(file("g", m.chunk("world\n")), dir("shared", shared))
	lost := delta.Hash([]byte("a chunk in no pack"))
	// The bad layer shares "shared" with the good one, and holds a subtree
	// whose chunk is in no pack, and one that does not decode.
	noChunk := m.tree(file("h", lost))
	junk := delta.Hash([]byte("junk"))
	m[junk] = []byte("junk")
	bad := m.tree(dir("a", shared), dir("b", noChunk))
	worse := m.tree(dir("a", shared), dir("j", junk))
	cp := func(n int, layer delta.ID) *delta.Checkpoint {
		return &delta.Checkpoint{ID: delta.Hash(fmt.Append(nil, n)), BaseTree: base, FSTree: layer}
	}
	w := &Whole{Loader: m, Has: func(id delta.ID) bool { _, ok := m[id]; return ok }}
	if err := w.Checkpoint(ctx, cp(1, good)); err != nil {
		t.Fatalf("whole checkpoint: %v", err)
	}
	if counts, exact := w.Counts(); !exact {
		t.Fatal("counts not exact with every checkpoint whole")
	} else if want, _ := CountRefs(ctx, m, []*delta.Checkpoint{cp(1, good)}); !maps.Equal(counts, want) {
		t.Fatalf("counts %v, CountRefs %v", counts, want)
	}
	err := w.Checkpoint(ctx, cp(2, bad))
	if !errors.Is(err, errdefs.ErrNotFound) || !Skippable(err) {
		t.Fatalf("checkpoint with a chunk in no pack: %v, want not found", err)
	}
	err = w.Checkpoint(ctx, cp(3, worse))
	if !errors.Is(err, errdefs.ErrCorrupt) || !Skippable(err) {
		t.Fatalf("checkpoint with a tree that does not decode: %v, want corrupt", err)
	}
	if err := w.Checkpoint(ctx, cp(4, good)); err != nil {
		t.Fatalf("a second whole checkpoint sharing trees with bad ones: %v", err)
	}
	if _, exact := w.Counts(); exact {
		t.Fatal("counts exact though trees only skipped checkpoints reach were counted")
	}
	// A walk that stops for its context is no checkpoint's fault.
	ctxDone, cancel := context.WithCancel(ctx)
	cancel()
	if err := (&Whole{Loader: m, Has: w.Has}).Checkpoint(ctxDone, cp(6, base)); err == nil || Skippable(err) {
		t.Fatalf("a cancelled walk: %v, want the context's error, not a skip", err)
	}
}
