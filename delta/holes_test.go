package delta

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func sparseTree(holes []Hole, size uint64, chunks ...ID) *Tree {
	return &Tree{Entries: []Entry{{Name: "f", Type: TypeFile, Mode: 0o644, Size: size, Chunks: chunks, Holes: holes}}}
}

// TestHostileHoleLists: every broken hole list is corruption, at decode or
// before a restore, and the error names the tree or the path.
func TestHostileHoleLists(t *testing.T) {
	ctx := context.Background()
	c := Hash([]byte("x"))
	good := sparseTree([]Hole{{0, 4096}, {8192, 4096}}, 16384, c)
	if _, err := DecodeTree(good.Encode()); err != nil {
		t.Fatalf("good sparse tree refused: %v", err)
	}
	tooMany := make([]Hole, MaxHoles+1)
	for i := range tooMany {
		tooMany[i] = Hole{uint64(2*i + 1), 1}
	}
	for name, tr := range map[string]*Tree{
		"empty hole":      sparseTree([]Hole{{0, 0}}, 10, c),
		"overlapping":     sparseTree([]Hole{{0, 10}, {5, 10}}, 100, c),
		"adjacent":        sparseTree([]Hole{{0, 10}, {10, 10}}, 100, c),
		"unsorted":        sparseTree([]Hole{{50, 10}, {0, 10}}, 100, c),
		"beyond size":     sparseTree([]Hole{{90, 20}}, 100, c),
		"starts beyond":   sparseTree([]Hole{{200, 1}}, 100, c),
		"huge size":       sparseTree([]Hole{{0, 1 << 62}}, 1<<62+1, c),
		"too many":        sparseTree(tooMany, uint64(2*len(tooMany)+2), c),
		"holes on a fifo": {Entries: []Entry{{Name: "p", Type: TypeFIFO, Holes: []Hole{{0, 1}}}}},
	} {
		_, err := DecodeTree(tr.Encode())
		if !errors.Is(err, errdefs.ErrCorrupt) {
			t.Errorf("%s: got %v, want ErrCorrupt", name, err)
		}
	}
	// A version 2 tree without holes is not canonical: it is a version 1 tree.
	v2 := append([]byte("TST\x02"), (&Tree{Entries: []Entry{{Name: "a", Type: TypeFile, Size: 1, Chunks: []ID{c}}}}).Encode()[4:]...)
	v2 = append(v2, 0) // the file's empty hole list
	if _, err := DecodeTree(v2); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Errorf("version 2 without holes: got %v", err)
	}
	// Version 3 (chunk lists) without a chunk list is not canonical either.
	if _, err := DecodeTree(append([]byte("TST\x03"), good.Encode()[4:]...)); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Errorf("version 3 without a chunk list: got %v", err)
	}
	if _, err := DecodeTree(append([]byte("TST\x04"), good.Encode()[4:]...)); err == nil || !strings.Contains(err.Error(), "version 4") {
		t.Errorf("version 4: got %v", err)
	}
	// Decodable, but the chunks cannot fill the data runs: refused by the
	// state check a restore runs first (fstree's TestMaterialiseRefusesHostileHoles),
	// naming the path.
	mem := newMem()
	mem.SaveBlob(ctx, BlobData, c, []byte("x"))
	for name, tr := range map[string]*Tree{
		"no chunks for data":  sparseTree([]Hole{{0, 4096}}, 1<<30),
		"chunks in no data":   sparseTree([]Hole{{0, 4096}}, 4096, c),
		"data beyond chunks":  sparseTree([]Hole{{0, 4096}}, 4096+ChunkMax+1, c),
		"chunk size mismatch": sparseTree([]Hole{{0, 4096}}, 4096+5, c),
	} {
		data := tr.Encode()
		id := Hash(data)
		mem.SaveBlob(ctx, BlobTree, id, data)
		_, err := CheckState(ctx, mem, id, StateRules{ChunkSize: func(ID) (uint64, error) { return 1, nil }})
		if !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), "/f") {
			t.Errorf("%s: got %v, want ErrCorrupt naming /f", name, err)
		}
	}
}
