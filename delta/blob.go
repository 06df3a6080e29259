package delta

import (
	"context"
	"fmt"
)

// BlobType says what a blob's plaintext is. The values are part of the
// on-disk format (pack headers); never renumber them.
type BlobType uint8

const (
	// BlobData is a chunk of file (or process image) bytes.
	BlobData BlobType = 1
	// BlobTree is an encoded Tree.
	BlobTree BlobType = 2
)

func (t BlobType) String() string {
	switch t {
	case BlobData:
		return "data"
	case BlobTree:
		return "tree"
	}
	return fmt.Sprintf("blobtype(%d)", uint8(t))
}

// BlobSaver stores blobs by content. Implementations deduplicate: saving a blob
// whose ID is already stored (or pending in this checkpoint) writes nothing and
// returns added=false. A blob saved is not durable until the implementation's
// own commit step says so.
type BlobSaver interface {
	SaveBlob(ctx context.Context, t BlobType, id ID, plaintext []byte) (added bool, err error)
}

// BlobLoader reads blobs back. Implementations return the plaintext only after
// checking that it hashes to id; a mismatch is an error wrapping
// errdefs.ErrCorrupt that names the blob and the object it came from.
type BlobLoader interface {
	LoadBlob(ctx context.Context, t BlobType, id ID) ([]byte, error)
}

// LoadTree loads and decodes the tree id, and loads the chunk lists of its
// indirect files (ResolveChunks), so every file entry's Chunks is whole.
// Errors name the tree.
func LoadTree(ctx context.Context, loader BlobLoader, id ID) (*Tree, error) {
	t, err := LoadTreeShallow(ctx, loader, id)
	if err != nil {
		return nil, err
	}
	if err := ResolveChunks(ctx, loader, t); err != nil {
		return nil, fmt.Errorf("tree %s: %w", id.Short(), err)
	}
	return t, nil
}

// LoadTreeShallow is LoadTree without loading chunk lists: an indirect
// file entry names its list (ChunkList, NChunks) and has no Chunks. Walkers
// that visit each distinct blob once load each list once themselves.
func LoadTreeShallow(ctx context.Context, loader BlobLoader, id ID) (*Tree, error) {
	data, err := loader.LoadBlob(ctx, BlobTree, id)
	if err != nil {
		return nil, fmt.Errorf("load tree %s: %w", id.Short(), err)
	}
	t, err := DecodeTree(data)
	if err != nil {
		return nil, fmt.Errorf("tree %s: %w", id.Short(), err)
	}
	return t, nil
}
