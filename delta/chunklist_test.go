package delta

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// chunkIDs returns n distinct chunk IDs.
func chunkIDs(n int) []ID {
	out := make([]ID, n)
	for i := range out {
		out[i] = Hash(fmt.Appendf(nil, "chunk %d", i))
	}
	return out
}

func bigFile(name string, n int) Entry {
	return Entry{Name: name, Type: TypeFile, Mode: 0o644, Size: uint64(n) * ChunkAverage, Chunks: chunkIDs(n)}
}

// TestIndirectChunkList: a file of more than IndirectChunks chunks names a
// chunk list in a version 3 tree; the tree reads back, and LoadTree loads
// the list; every other tree keeps its version 1 or 2 bytes.
func TestIndirectChunkList(t *testing.T) {
	ctx := context.Background()
	mem := newMem()
	small := &Tree{Entries: []Entry{bigFile("a", IndirectChunks)}}
	if lists := small.MakeIndirect(IDs{}); len(lists) != 0 || small.Encode()[3] != treeVersionPlain {
		t.Fatalf("a file of %d chunks got a list (%d) or version %d", IndirectChunks, len(lists), small.Encode()[3])
	}
	tr := &Tree{Entries: []Entry{bigFile("big", 40), {Name: "small", Type: TypeFile, Size: 2, Chunks: chunkIDs(1)}}}
	id, data, err := SaveTree(ctx, IDs{}, tr, func(ctx context.Context, id ID, data []byte) error {
		_, err := mem.SaveBlob(ctx, BlobTree, id, data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if data[3] != treeVersionIndirect || len(mem.m) != 2 {
		t.Fatalf("version %d, %d blobs saved; want 3 and a tree and a list", data[3], len(mem.m))
	}
	// The entry costs 32 bytes for the list, not 40 x 32.
	if len(data) > 200 {
		t.Fatalf("tree of an indirect file is %d bytes", len(data))
	}
	shallow, err := DecodeTree(data)
	if err != nil {
		t.Fatal(err)
	}
	e := shallow.Find("big")
	if !e.Indirect() || e.NChunks != 40 || e.Chunks != nil || e.Resolved() {
		t.Fatalf("decoded entry: list %v, %d chunks, %d loaded", e.Indirect(), e.NChunks, len(e.Chunks))
	}
	if refs := shallow.Refs(); len(refs) != 2 || refs[0] != e.ChunkList {
		t.Fatalf("refs %v: want the list and the small file's chunk", refs)
	}
	full, err := LoadTree(ctx, mem, id)
	if err != nil {
		t.Fatal(err)
	}
	if got := full.Find("big").Chunks; len(got) != 40 || got[39] != chunkIDs(40)[39] {
		t.Fatalf("resolved %d chunks", len(got))
	}
	inline := bigFile("big", 40)
	if !SameChunks(full.Find("big"), e) || !SameChunks(full.Find("big"), &inline) {
		t.Fatal("resolved, unresolved and inline entries of one content differ")
	}
	if !bytes.Equal(full.Encode(), data) {
		t.Fatal("a resolved tree re-encodes differently")
	}
	refs, err := BlobRefs(mem.m[e.ChunkList])
	if err != nil || len(refs) != 40 {
		t.Fatalf("list refs: %d, %v", len(refs), err)
	}
	// A restore given an entry whose list was never loaded loads it (fstree's
	// TestStreamContentLoadsChunkList streams such an entry).
	if got, err := LoadChunks(ctx, mem, e); err != nil || len(got) != 40 || got[39] != chunkIDs(40)[39] {
		t.Fatalf("chunks of an entry whose list was not loaded: %d, %v", len(got), err)
	}
}

// TestOldTreesStillRead: trees written before chunk lists (version 1 with
// a long inline list, version 2 with holes) decode, keep their bytes and
// ID, and their files' chunks are inline. The fixtures were written by the
// encoder before chunk lists (commit ccdba54: a file "big" of 40 chunks
// named "chunk 0".."chunk 39", inline) and are never regenerated.
func TestOldTreesStillRead(t *testing.T) {
	for _, name := range []string{"tree-v1-inline40.bin", "tree-v2-sparse.bin"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		tr, err := DecodeTree(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(tr.Encode(), data) {
			t.Fatalf("%s: re-encodes differently", name)
		}
		for _, e := range tr.Entries {
			if e.Indirect() || !e.Resolved() {
				t.Fatalf("%s: %s reads as indirect", name, e.Name)
			}
		}
		if f := tr.Find("big"); f == nil || len(f.Chunks) != 40 {
			t.Fatalf("%s: no inline 40-chunk file", name)
		}
	}
}

// TestHostileChunkLists: every bound of a version 3 entry and of a list.
func TestHostileChunkLists(t *testing.T) {
	ctx := context.Background()
	list := chunkIDs(40)
	good := EncodeChunkList(list)
	v3 := func(nc uint64, listID ID) []byte {
		b := []byte("TST\x03")
		b = binary.AppendUvarint(b, 1)
		b = appendString(b, "f")
		b = append(b, byte(TypeFile), 0, 0, 0, 0, 0, 0)
		b = binary.AppendUvarint(b, nc*ChunkAverage)
		b = binary.AppendUvarint(b, nc)
		b = append(b, listID[:]...)
		return append(b, 0) // no holes
	}
	if _, err := DecodeTree(v3(40, Hash(good))); err != nil {
		t.Fatalf("good version 3 tree: %v", err)
	}
	for name, data := range map[string][]byte{
		"a list of too few chunks":  v3(IndirectChunks, Hash(good)),
		"a list of too many chunks": v3(MaxFileChunks+1, Hash(good)),
		"a list of 2^64-1 chunks":   v3(^uint64(0)>>1, Hash(good)),
		"a zero list ID":            v3(40, ID{}),
		"version 3 without a list":  nil,
		"truncated list ID":         v3(40, Hash(good))[:30],
	} {
		if name == "version 3 without a list" {
			data = append([]byte("TST\x03"), (&Tree{Entries: []Entry{bigFile("f", 3)}}).Encode()[4:]...)
			data = append(data, 0)
		}
		if _, err := DecodeTree(data); !errors.Is(err, errdefs.ErrCorrupt) {
			t.Errorf("%s: %v, want corruption", name, err)
		}
	}
	for name, data := range map[string][]byte{
		"trailing byte":      append(bytes.Clone(good), 0),
		"short":              good[:len(good)-1],
		"non-minimal varint": append(append([]byte("TSL\x01"), 0x80|40, 0x00), good[5:]...),
		"version 2":          append([]byte("TSL\x02"), good[4:]...),
		"too few":            EncodeChunkList(list[:IndirectChunks]),
		"magic only":         []byte("TSL"),
		"count over data":    append([]byte("TSL\x01"), binary.AppendUvarint(nil, MaxFileChunks)...),
	} {
		if _, err := DecodeChunkList(data); !errors.Is(err, errdefs.ErrCorrupt) {
			t.Errorf("list %s: %v, want corruption", name, err)
		}
	}
	// A list whose count disagrees with its entry's.
	mem := newMem()
	mem.SaveBlob(ctx, BlobTree, Hash(good), good)
	if _, err := LoadChunkList(ctx, mem, Hash(good), 41); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("list of 40 named as 41: %v", err)
	}
	// A tree where a list is expected, or a list where a tree is.
	tr := (&Tree{Entries: []Entry{bigFile("f", 1)}}).Encode()
	mem.SaveBlob(ctx, BlobTree, Hash(tr), tr)
	if _, err := LoadChunkList(ctx, mem, Hash(tr), 40); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("tree as a list: %v", err)
	}
	if _, err := LoadTree(ctx, mem, Hash(good)); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("list as a tree: %v", err)
	}
}

// FuzzDecodeChunkList: the list decoder accepts only canonical lists within
// the bounds, and never panics.
func FuzzDecodeChunkList(f *testing.F) {
	f.Add(EncodeChunkList(chunkIDs(17)))
	f.Add(EncodeChunkList(chunkIDs(16)))
	f.Add([]byte("TSL\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"))
	f.Add([]byte("TSL"))
	f.Fuzz(func(t *testing.T, data []byte) {
		chunks, err := DecodeChunkList(data)
		if err != nil {
			if !errors.Is(err, errdefs.ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if len(chunks) <= IndirectChunks || len(chunks) > MaxFileChunks || !bytes.Equal(EncodeChunkList(chunks), data) {
			t.Fatalf("accepted a list of %d chunks that does not re-encode", len(chunks))
		}
	})
}
