package delta

import (
	"context"
	"errors"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// FuzzDecodeBlob feeds the one blob decoder every reader uses arbitrary
// stored bytes and declared lengths: it may only return corruption, never
// panic, never return more than the type's limit, and never return bytes
// that do not hash to the ID.
func FuzzDecodeBlob(f *testing.F) {
	c, err := NewCodec()
	if err != nil {
		f.Fatal(err)
	}
	defer c.Close()
	plain := []byte("a chunk of file content, a chunk of file content, a chunk of file content")
	frame, _ := c.Compress(nil, plain)
	id := Hash(plain)
	f.Add(uint8(BlobData), true, uint64(len(plain)), id[:], frame)
	f.Add(uint8(BlobData), false, uint64(len(plain)), id[:], plain)
	f.Add(uint8(BlobTree), true, uint64(1)<<62, id[:], frame)
	f.Add(uint8(BlobData), true, ^uint64(0), id[:], frame)
	f.Fuzz(func(t *testing.T, typ uint8, compressed bool, rawLen uint64, idb []byte, stored []byte) {
		var id ID
		copy(id[:], idb)
		out, err := c.DecodeBlob(IDs{}, BlobType(typ), id, compressed, rawLen, stored)
		if err != nil {
			if !errors.Is(err, errdefs.ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if uint64(len(out)) != rawLen || rawLen > MaxRawLength(BlobType(typ)) || Hash(out) != id {
			t.Fatalf("accepted %d bytes for a blob declaring %d", len(out), rawLen)
		}
	})
}

// FuzzCheckState runs the restore rules over a state whose root tree is the
// fuzz input and whose every other tree is that same tree (a self-similar
// DAG), so the footprint and hardlink passes meet hostile shapes.
func FuzzCheckState(f *testing.F) {
	hello := Hash([]byte("hello"))
	f.Add((&Tree{Entries: []Entry{
		{Name: "a", Type: TypeHardlink, Target: "b"},
		{Name: "b", Type: TypeFile, Size: 5, Chunks: []ID{hello}},
		{Name: "l", Type: TypeSymlink, Target: "b"},
	}}).Encode(), true)
	f.Add((&Tree{Entries: []Entry{{Name: "w", Type: TypeWhiteout}}}).Encode(), false)
	// Sparse files: chunks that fill the data runs, and ones that cannot.
	f.Add((&Tree{Entries: []Entry{{Name: "s", Type: TypeFile, Size: 1<<30 + 5, Chunks: []ID{hello}, Holes: []Hole{{0, 1 << 30}}}}}).Encode(), true)
	f.Add((&Tree{Entries: []Entry{{Name: "s", Type: TypeFile, Size: 1 << 40, Holes: []Hole{{0, 1<<40 - 1}}}}}).Encode(), true)
	f.Add((&Tree{Entries: []Entry{
		{Name: "d", Type: TypeDir, Subtree: hello},
		{Name: "s", Type: TypeFile, Size: 1 << 43, Chunks: []ID{hello, hello}, Holes: []Hole{{5, 1<<43 - 10}}},
	}}).Encode(), false)
	f.Fuzz(func(t *testing.T, data []byte, plain bool) {
		root := Hash(data)
		loader := selfLoader{root: root, data: data}
		_, err := CheckState(context.Background(), loader, root, StateRules{Plain: plain,
			ChunkSize: func(ID) (uint64, error) { return 5, nil }})
		if err != nil && !errors.Is(err, errdefs.ErrCorrupt) {
			t.Fatalf("error %v does not wrap ErrCorrupt", err)
		}
	})
}

// selfLoader serves one tree under its own ID and under every other ID.
type selfLoader struct {
	root ID
	data []byte
}

func (l selfLoader) LoadBlob(_ context.Context, t BlobType, id ID) ([]byte, error) {
	return l.data, nil
}
