package delta

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// CheckState counts what a restore writes without expanding shared
// subtrees, and refuses states too large or too deep before any write.
func TestCheckStateBoundsExpansionAndDepth(t *testing.T) {
	ctx := context.Background()
	mem := newMem()
	put := func(tr *Tree) ID {
		d := tr.Encode()
		id := Hash(d)
		mem.SaveBlob(ctx, BlobTree, id, d)
		return id
	}
	fan := func(sub ID, n int) ID {
		tr := &Tree{}
		for i := range n {
			tr.Entries = append(tr.Entries, Entry{Name: fmt.Sprintf("d%02d", i), Type: TypeDir, Mode: 0o755, Subtree: sub})
		}
		return put(tr)
	}
	leaf := put(&Tree{Entries: []Entry{{Name: "f", Type: TypeFile, Mode: 0o644}}})
	small := fan(fan(leaf, 10), 10) // 10 + 100 dirs, 100 files
	fp, err := CheckState(ctx, mem, small, StateRules{})
	if err != nil || fp.Entries != 210 || fp.Files != 100 || fp.Trees != 3 {
		t.Fatalf("footprint %+v, %v; want 210 entries, 100 files, 3 trees", fp, err)
	}
	bomb := leaf
	for range 7 {
		bomb = fan(bomb, 16) // 16^7 = 2^28 files
	}
	if _, err := CheckState(ctx, mem, bomb, StateRules{}); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("a DAG of 2^28 files: %v, want corruption", err)
	}
	deep := leaf
	for range MaxDepth + 1 {
		deep = fan(deep, 1)
	}
	if _, err := CheckState(ctx, mem, deep, StateRules{}); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("%d nested directories: %v, want corruption", MaxDepth+1, err)
	}
}
