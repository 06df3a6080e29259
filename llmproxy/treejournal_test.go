package llmproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// memBlobs is an in-memory blob store (saver and verifying loader).
type memBlobs map[delta.ID][]byte

func (m memBlobs) SaveBlob(_ context.Context, _ delta.BlobType, id delta.ID, b []byte) (bool, error) {
	_, had := m[id]
	m[id] = bytes.Clone(b)
	return !had, nil
}

func (m memBlobs) LoadBlob(_ context.Context, _ delta.BlobType, id delta.ID) ([]byte, error) {
	b, ok := m[id]
	if !ok {
		return nil, fmt.Errorf("blob %s: %w", id.Short(), errdefs.ErrNotFound)
	}
	if delta.Hash(b) != id {
		return nil, fmt.Errorf("blob %s: %w", id.Short(), errdefs.ErrCorrupt)
	}
	return b, nil
}

func testEntry(turn int, reply string) *Entry {
	return &Entry{Conv: delta.Hash([]byte(fmt.Sprint("conv", turn))), Turn: turn, Shape: ShapeChat, Status: 200,
		ContentType: "application/json", Request: []byte(`{"messages":[]}`), Response: []byte(reply)}
}

// The journal's life: entries in memory until a checkpoint saves and
// commits them, a snapshot holds only earlier turns, and a reset to a saved
// tree answers from the store with the same bytes.
func TestTreeJournalLifecycle(t *testing.T) {
	ctx := context.Background()
	blobs := memBlobs{}
	j := NewTreeJournal(delta.IDs{}, blobs)
	big := bytes.Repeat([]byte("0123456789abcdef"), 20000) // several chunks
	for i := 0; i < 3; i++ {
		e := testEntry(i, fmt.Sprintf("reply %d", i))
		if i == 1 {
			e.Response = big
		}
		if err := j.Put(ctx, "s", e); err != nil {
			t.Fatal(err)
		}
	}
	snap := j.Snapshot("s", 2)
	if snap.Len() != 2 {
		t.Fatalf("snapshot before turn 2 holds %d entries", snap.Len())
	}
	root, err := snap.Save(ctx, blobs)
	if err != nil || root == nil {
		t.Fatal(err)
	}
	// The tree is a plain state a restore accepts.
	if _, err := delta.CheckState(ctx, blobs, *root, delta.StateRules{Plain: true, ChunkSize: func(id delta.ID) (uint64, error) {
		return uint64(len(blobs[id])), nil
	}}); err != nil {
		t.Fatalf("journal tree: %v", err)
	}
	j.Committed(ctx, snap)
	if err := j.Reset(ctx, "s", root); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		e, err := j.Get(ctx, "s", testEntry(i, "").Conv)
		switch {
		case err != nil:
			t.Fatal(err)
		case i == 2 && e != nil:
			t.Fatal("turn 2 survived a reset to the tree of turn 2's checkpoint")
		case i == 1 && !bytes.Equal(e.Response, big), i == 0 && string(e.Response) != "reply 0":
			t.Fatalf("entry %d came back different", i)
		}
	}
	// A damaged chunk is corruption, never a wrong reply.
	for id, b := range blobs {
		if len(b) > 1000 && !bytes.HasPrefix(b, []byte("TST")) {
			blobs[id] = append(bytes.Clone(b[:len(b)-1]), b[len(b)-1]^1)
		}
	}
	if _, err := j.Get(ctx, "s", testEntry(1, "").Conv); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("damaged entry: %v", err)
	}
	if err := j.Reset(ctx, "s", nil); err != nil {
		t.Fatal(err)
	}
	if e, _ := j.Get(ctx, "s", testEntry(0, "").Conv); e != nil {
		t.Fatal("an emptied journal answered")
	}
}

// FuzzJournalTree: a hostile journal tree and hostile entry bytes are
// refused as corruption, and never answer for a conversation they do not
// hold.
func FuzzJournalTree(f *testing.F) {
	ctx := context.Background()
	blobs := memBlobs{}
	j := NewTreeJournal(delta.IDs{}, blobs)
	for i := 0; i < 2; i++ {
		j.Put(ctx, "s", testEntry(i, "r"))
	}
	root, err := j.Snapshot("s", -1).Save(ctx, blobs)
	if err != nil {
		f.Fatal(err)
	}
	tree := blobs[*root]
	var chunk []byte
	for id, b := range blobs {
		if id != *root {
			chunk = b
		}
	}
	f.Add(tree, chunk)
	f.Add(tree[:len(tree)-3], chunk[:10])
	f.Fuzz(func(t *testing.T, treeBytes, entry []byte) {
		m := memBlobs{delta.Hash(treeBytes): treeBytes}
		tr, err := delta.DecodeTree(treeBytes)
		if err != nil {
			return
		}
		// Every chunk the tree names holds the fuzzed entry bytes (a
		// loader that does not verify, as a hostile store might be).
		for _, e := range tr.Entries {
			for _, c := range e.Chunks {
				m[c] = entry
			}
		}
		loose := looseBlobs(m)
		jj := NewTreeJournal(delta.IDs{}, loose)
		root := delta.Hash(treeBytes)
		if err := jj.Reset(ctx, "x", &root); err != nil {
			if !errors.Is(err, errdefs.ErrCorrupt) {
				t.Fatalf("reset error %v is not corruption", err)
			}
			return
		}
		for _, e := range tr.Entries {
			conv, _, _ := parseJournalFileName(e.Name)
			got, err := jj.Get(ctx, "x", conv)
			if err != nil {
				if !errors.Is(err, errdefs.ErrCorrupt) {
					t.Fatalf("get error %v is not corruption", err)
				}
				continue
			}
			if got.Conv != conv {
				t.Fatalf("asked for %s, answered %s", conv.Short(), got.Conv.Short())
			}
		}
	})
}

// looseBlobs loads without verifying hashes.
type looseBlobs map[delta.ID][]byte

func (m looseBlobs) LoadBlob(_ context.Context, _ delta.BlobType, id delta.ID) ([]byte, error) {
	b, ok := m[id]
	if !ok {
		return nil, fmt.Errorf("blob %s: %w", id.Short(), errdefs.ErrCorrupt)
	}
	return b, nil
}
