package delta

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Indirect chunk lists (docs/FORMAT.md, "Indirect chunk lists", tree
// version 3). A file of more than IndirectChunks chunks names one
// content-addressed chunk list blob instead of listing its chunks inline,
// so a directory rewritten because a small file next to a big one changed
// costs the directory's entries, not the big file's whole chunk list
// (32 bytes per 64 KiB: 5 MiB for a 10 GiB file) once per turn. The list
// is stored as a tree-type blob (it lives in tree packs with the trees that
// walkers read, under the tree size limit) with its own magic.
const (
	// IndirectChunks is the most chunks a file entry lists inline in a
	// tree written now: its inline list is at most 512 bytes, a few
	// entries' worth. Larger files name a chunk list.
	IndirectChunks = 16
	// MaxFileChunks bounds the chunks of one indirect file: its chunk list
	// then fits the tree size limit (4 + 3 + 32 x n <= MaxTreeSize). An
	// inline list was already bounded by the same limit through its tree.
	MaxFileChunks = (MaxTreeSize - 16) / 32
)

// treeVersionIndirect is the tree version that may hold an indirect file:
// a tree is version 3 exactly when one of its file entries names a chunk
// list, so every other tree keeps its version 1 or 2 bytes and ID.
const treeVersionIndirect = 3

// chunkListMagic starts every encoded chunk list; the last byte is its
// format version.
var chunkListMagic = []byte{'T', 'S', 'L', 1}

// Indirect reports whether e names a chunk list rather than listing its
// chunks inline.
func (e *Entry) Indirect() bool { return !e.ChunkList.IsZero() }

// ChunkCount is how many chunks e's content has, whether they are listed
// inline or in a chunk list not loaded yet.
func (e *Entry) ChunkCount() uint64 {
	if e.Indirect() {
		return e.NChunks
	}
	return uint64(len(e.Chunks))
}

// Resolved reports whether e.Chunks holds e's whole chunk list: false only
// for an indirect entry whose list has not been loaded (ResolveChunks).
func (e *Entry) Resolved() bool { return uint64(len(e.Chunks)) == e.ChunkCount() }

// SameChunks reports whether a and b have the same chunks, comparing chunk
// list IDs when the lists are not both loaded (equal lists have equal IDs
// under one ID scheme).
func SameChunks(a, b *Entry) bool {
	if a.Indirect() && a.ChunkList == b.ChunkList {
		return true
	}
	if !a.Resolved() || !b.Resolved() {
		return a.ChunkList == b.ChunkList && a.ChunkCount() == b.ChunkCount()
	}
	if len(a.Chunks) != len(b.Chunks) {
		return false
	}
	for i := range a.Chunks {
		if a.Chunks[i] != b.Chunks[i] {
			return false
		}
	}
	return true
}

// EncodeChunkList returns the canonical encoding of a chunk list.
func EncodeChunkList(chunks []ID) []byte {
	b := make([]byte, 0, len(chunkListMagic)+binary.MaxVarintLen64+32*len(chunks))
	b = append(b, chunkListMagic...)
	b = binary.AppendUvarint(b, uint64(len(chunks)))
	for _, c := range chunks {
		b = append(b, c[:]...)
	}
	return b
}

// IsChunkList reports whether a tree-type blob's plaintext is a chunk list
// (by its magic) rather than a tree.
func IsChunkList(data []byte) bool { return bytes.HasPrefix(data, chunkListMagic[:3]) }

// DecodeChunkList parses an encoded chunk list and rejects anything that is
// not the canonical encoding of a list of more than IndirectChunks and at
// most MaxFileChunks chunks.
func DecodeChunkList(data []byte) ([]ID, error) {
	bad := func(format string, args ...any) ([]ID, error) {
		return nil, fmt.Errorf("chunk list: %s: %w", fmt.Sprintf(format, args...), errdefs.ErrCorrupt)
	}
	if len(data) > MaxTreeSize {
		return bad("%d bytes, more than the limit %d", len(data), MaxTreeSize)
	}
	if !IsChunkList(data) || len(data) < len(chunkListMagic) {
		return bad("bad magic")
	}
	if data[3] != chunkListMagic[3] {
		return bad("unsupported format version %d", data[3])
	}
	rest := data[len(chunkListMagic):]
	n, k := binary.Uvarint(rest)
	if k <= 0 {
		return bad("bad varint")
	}
	if k != len(binary.AppendUvarint(nil, n)) {
		return bad("not canonically encoded")
	}
	rest = rest[k:]
	if n <= IndirectChunks || n > MaxFileChunks {
		return bad("%d chunks, not between %d and %d", n, IndirectChunks+1, MaxFileChunks)
	}
	if uint64(len(rest)) != 32*n {
		return bad("%d bytes for %d chunks", len(rest), n)
	}
	out := make([]ID, n)
	for i := range out {
		copy(out[i][:], rest[32*i:])
	}
	return out, nil
}

// ChunkListBlob is a chunk list a writer must store (as a BlobTree) before
// the tree that names it.
type ChunkListBlob struct {
	ID   ID
	Data []byte
}

// MakeIndirect gives every file entry of t with more than IndirectChunks
// inline chunks a chunk list, hashed under ids, and returns the lists to
// store before t. Writers call it before Encode;
// a tree decoded from version 1 or 2 bytes and re-encoded unchanged is
// not passed through it, so it keeps its bytes.
func (t *Tree) MakeIndirect(ids IDs) []ChunkListBlob {
	var out []ChunkListBlob
	for i := range t.Entries {
		if l, ok := t.Entries[i].MakeIndirect(ids); ok {
			out = append(out, l)
		}
	}
	return out
}

// MakeIndirect is Tree.MakeIndirect for one entry: a scan calls it before
// the entry goes into both its tree and its state tree.
func (e *Entry) MakeIndirect(ids IDs) (ChunkListBlob, bool) {
	// A list is made whenever the chunks are at hand, even for an entry
	// that names one already (taken over from a cache or a stored tree):
	// hashing it costs little next to a dangling reference should that
	// list never have reached this store, and the saver deduplicates it.
	// An entry whose list is not loaded keeps it: it came from a tree
	// stored with its list.
	if e.Type != TypeFile || len(e.Chunks) <= IndirectChunks {
		return ChunkListBlob{}, false
	}
	data := EncodeChunkList(e.Chunks)
	id := ids.Hash(data)
	e.ChunkList, e.NChunks = id, uint64(len(e.Chunks))
	return ChunkListBlob{ID: id, Data: data}, true
}

// SaveTree makes t's chunk lists (MakeIndirect), saves them, then saves t
// through save, and returns t's ID and encoding: lists first, so a tree
// never reaches a store before a list it names. (The scans, compose and
// the journal do the same steps inline, through their own savers.)
func SaveTree(ctx context.Context, ids IDs, t *Tree, save func(ctx context.Context, id ID, data []byte) error) (ID, []byte, error) {
	for _, l := range t.MakeIndirect(ids) {
		if err := save(ctx, l.ID, l.Data); err != nil {
			return ID{}, nil, fmt.Errorf("chunk list %s: %w", l.ID.Short(), err)
		}
	}
	data := t.Encode()
	id := ids.Hash(data)
	if err := save(ctx, id, data); err != nil {
		return ID{}, nil, err
	}
	return id, data, nil
}

// LoadChunkList loads and decodes chunk list id, which its entry says
// names n chunks. Errors name the list.
func LoadChunkList(ctx context.Context, loader BlobLoader, id ID, n uint64) ([]ID, error) {
	data, err := loader.LoadBlob(ctx, BlobTree, id)
	if err != nil {
		return nil, fmt.Errorf("load chunk list %s: %w", id.Short(), err)
	}
	chunks, err := DecodeChunkList(data)
	if err != nil {
		return nil, fmt.Errorf("chunk list %s: %w", id.Short(), err)
	}
	if uint64(len(chunks)) != n {
		return nil, fmt.Errorf("chunk list %s: %d chunks, its entry says %d: %w", id.Short(), len(chunks), n, errdefs.ErrCorrupt)
	}
	return chunks, nil
}

// ResolveChunks loads the chunk list of every indirect file entry of t
// that is not loaded yet, so that e.Chunks holds every file's chunks.
func ResolveChunks(ctx context.Context, loader BlobLoader, t *Tree) error {
	for i := range t.Entries {
		e := &t.Entries[i]
		if e.Type != TypeFile || e.Resolved() {
			continue
		}
		chunks, err := LoadChunkList(ctx, loader, e.ChunkList, e.NChunks)
		if err != nil {
			return fmt.Errorf("file %q: %w", e.Name, err)
		}
		e.Chunks = chunks
	}
	return nil
}

// BlobRefs lists the references a tree-type blob holds, as refcounts count
// them: a tree's Refs, or a chunk list's chunks (once per listing).
func BlobRefs(data []byte) ([]ID, error) {
	if IsChunkList(data) {
		return DecodeChunkList(data)
	}
	t, err := DecodeTree(data)
	if err != nil {
		return nil, err
	}
	return t.Refs(), nil
}

// UnresolvedError is what a restore returns for an indirect entry whose chunk
// list was never loaded: a caller's bug, never written as an empty file.
func UnresolvedError(e *Entry) error {
	return fmt.Errorf("file %q: chunk list %s not loaded: %w", e.Name, e.ChunkList.Short(), errdefs.ErrPrecondition)
}

// LoadChunks returns e's chunks, loading its chunk list through loader when
// the entry came from a tree decoded without it.
func LoadChunks(ctx context.Context, loader BlobLoader, e *Entry) ([]ID, error) {
	if e.Resolved() {
		return e.Chunks, nil
	}
	return LoadChunkList(ctx, loader, e.ChunkList, e.NChunks)
}
