package delta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// memBlobs is a unit-test stand-in for the pack store; engine tests cover the real one.
type memBlobs struct {
	mu sync.Mutex
	m  map[ID][]byte
}

func newMem() *memBlobs { return &memBlobs{m: map[ID][]byte{}} }

func (s *memBlobs) SaveBlob(_ context.Context, _ BlobType, id ID, data []byte) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[id]; ok {
		return false, nil
	}
	s.m[id] = bytes.Clone(data)
	return true, nil
}

func (s *memBlobs) LoadBlob(_ context.Context, _ BlobType, id ID) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.m[id]
	if !ok {
		return nil, fmt.Errorf("blob %s: %w", id.Short(), errdefs.ErrNotFound)
	}
	if Hash(d) != id {
		return nil, fmt.Errorf("blob %s: %w", id.Short(), errdefs.ErrCorrupt)
	}
	return d, nil
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestDecodeTreeRejectsNonCanonical(t *testing.T) {
	good := &Tree{Entries: []Entry{
		{Name: "a", Type: TypeFile, Mode: 0o644, Size: 1, Chunks: []ID{Hash([]byte("x"))}},
		{Name: "b", Type: TypeSymlink, Mode: 0o777, Target: "a"},
	}}
	data := good.Encode()
	back, err := DecodeTree(data)
	must(t, err)
	if !bytes.Equal(back.Encode(), data) {
		t.Fatal("round trip changed the encoding")
	}
	swapped := &Tree{Entries: []Entry{good.Entries[1], good.Entries[0]}}
	if _, err := DecodeTree(swapped.Encode()); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("unsorted tree accepted: %v", err)
	}
	for _, bad := range []string{"..", ".", "a/b", ""} {
		tr := &Tree{Entries: []Entry{{Name: bad, Type: TypeFIFO}}}
		if _, err := DecodeTree(tr.Encode()); err == nil {
			t.Errorf("name %q accepted", bad)
		}
	}
	if _, err := DecodeTree(append(data, 0)); err == nil {
		t.Error("trailing byte accepted")
	}
	for i := range data {
		c := bytes.Clone(data)
		c[i] ^= 0x40
		if tr, err := DecodeTree(c); err == nil && bytes.Equal(tr.Encode(), data) {
			t.Errorf("flip at %d decoded to the original tree", i)
		}
	}
}

func FuzzDecodeTree(f *testing.F) {
	f.Add((&Tree{Entries: []Entry{{Name: "a", Type: TypeDir, Mode: 0o755, Subtree: Hash(nil)}}}).Encode())
	f.Add([]byte("TST")) // once crashed the magic check
	// Sparse files (version 2): a good hole list, and hostile ones.
	c := Hash([]byte("x"))
	for _, holes := range [][]Hole{{{0, 4096}, {8192, 1 << 30}}, {{0, 0}}, {{5, 10}, {0, 3}}, {{0, 10}, {10, 1}}, {{1 << 43, 1 << 43}}} {
		f.Add((&Tree{Entries: []Entry{{Name: "f", Type: TypeFile, Mode: 0o644, Size: 8193 + 1<<30, Chunks: []ID{c}, Holes: holes}}}).Encode())
	}
	// Indirect chunk lists (version 3): a file naming a list.
	v3 := &Tree{Entries: []Entry{{Name: "big", Type: TypeFile, Mode: 0o644, Size: 40 * ChunkAverage, Chunks: chunkIDs(40)}}}
	v3.MakeIndirect(IDs{})
	f.Add(v3.Encode())
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := DecodeTree(data)
		if err == nil && !bytes.Equal(tr.Encode(), data) {
			t.Fatal("accepted a non-canonical encoding")
		}
	})
}

func TestDiffLayers(t *testing.T) {
	ctx := context.Background()
	mem := newMem()
	put := func(tr *Tree) ID {
		tr.Sort()
		d := tr.Encode()
		id := Hash(d)
		mem.SaveBlob(ctx, BlobTree, id, d)
		return id
	}
	f := func(name, content string) Entry {
		return Entry{Name: name, Type: TypeFile, Mode: 0o644, Size: uint64(len(content)), Chunks: []ID{Hash([]byte(content))}}
	}
	sub := put(&Tree{Entries: []Entry{f("x", "1"), f("y", "2")}})
	base := put(&Tree{Entries: []Entry{f("keep", "k"), f("del", "d"), {Name: "dir", Type: TypeDir, Mode: 0o755, Subtree: sub}}})
	upper := put(&Tree{Entries: []Entry{
		{Name: "del", Type: TypeWhiteout},
		f("new", "n"),
		{Name: "dir", Type: TypeDir, Mode: 0o755, Subtree: put(&Tree{Entries: []Entry{f("x", "changed")}})},
	}})
	opaque := put(&Tree{Entries: []Entry{{Name: "dir", Type: TypeDir, Mode: 0o755, Opaque: true, Subtree: EmptyTree()}}})
	mem.SaveBlob(ctx, BlobTree, EmptyTree(), (&Tree{}).Encode())
	// What a change is, without the entries it carries.
	kinds := func(cs []Change) []Change {
		out := []Change{}
		for _, c := range cs {
			out = append(out, Change{Kind: c.Kind, Path: c.Path, Type: c.Type})
		}
		return out
	}
	got, err := Diff(ctx, mem, Layers{base, EmptyTree()}, Layers{base, upper})
	must(t, err)
	got = kinds(got)
	want := []Change{{Kind: Deleted, Path: "del", Type: TypeFile}, {Kind: Modified, Path: "dir/x", Type: TypeFile}, {Kind: Added, Path: "new", Type: TypeFile}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("diff = %v, want %v", got, want)
	}
	got, err = Diff(ctx, mem, Layers{base, upper}, Layers{base, opaque})
	must(t, err)
	got = kinds(got)
	want = []Change{{Kind: Added, Path: "del", Type: TypeFile}, {Kind: Deleted, Path: "dir/x", Type: TypeFile}, {Kind: Deleted, Path: "dir/y", Type: TypeFile}, {Kind: Deleted, Path: "new", Type: TypeFile}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("opaque diff = %v, want %v", got, want)
	}
}

// The small-file fast path must cut exactly as the chunker does.
func TestChunkFastPathMatchesChunker(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	for _, size := range []int{0, 1, 100, ChunkMin - 1, ChunkMin, ChunkMin + 1, ChunkMax, 3*ChunkMax + 17, 5 << 20} {
		data := make([]byte, size)
		rng.Read(data)
		var viaChunker, viaSized []ID
		must(t, ChunkReader(bytes.NewReader(data), func(c []byte) error { viaChunker = append(viaChunker, Hash(c)); return nil }))
		must(t, NewChunker().Chunk(bytes.NewReader(data), int64(size), func(c []byte) error {
			viaSized = append(viaSized, Hash(c))
			return nil
		}))
		if fmt.Sprint(viaChunker) != fmt.Sprint(viaSized) {
			t.Errorf("size %d: fast path cut %d chunks, chunker %d", size, len(viaSized), len(viaChunker))
		}
	}
}
