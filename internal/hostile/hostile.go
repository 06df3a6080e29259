// Package hostile builds damaged and malicious store objects for tests:
// packs whose headers lie, zstd frames that inflate far past what they
// declare, tree DAGs that expand to billions of entries, and layers that
// break the rules a restore applies. Each is written into a real store with
// the store's own object names, so the code under test meets it the way it
// would meet a hostile bucket.
package hostile

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/upload"
)

// Blob is one blob as a pack stores it; RawLength may lie.
type Blob struct {
	Type        delta.BlobType
	ID          delta.ID
	Stored      []byte
	RawLength   uint64
	Compression delta.Compression
}

// Plain is an uncompressed blob named by its content.
func Plain(t delta.BlobType, data []byte) Blob {
	return Blob{Type: t, ID: delta.Hash(data), Stored: data, RawLength: uint64(len(data))}
}

// Tree encodes t without checking it (delta.Tree.Encode does not) as a blob.
func Tree(t *delta.Tree) Blob { return Plain(delta.BlobTree, t.Encode()) }

// EncodePack lays blobs out in the pack format (docs/FORMAT.md, "Pack")
// with whatever each declares, and returns the bytes and the pack's ID.
func EncodePack(blobs []Blob) ([]byte, delta.ID) {
	var data, header []byte
	header = binary.AppendUvarint(header, uint64(len(blobs)))
	for _, b := range blobs {
		header = append(header, byte(b.Type))
		header = append(header, b.ID[:]...)
		header = binary.AppendUvarint(header, uint64(len(data)))
		header = binary.AppendUvarint(header, uint64(len(b.Stored)))
		header = binary.AppendUvarint(header, b.RawLength)
		header = append(header, byte(b.Compression))
		data = append(data, b.Stored...)
	}
	data = append(data, header...)
	data = binary.LittleEndian.AppendUint32(data, uint32(len(header)))
	data = append(data, "TSP1"...)
	return data, delta.Hash(data)
}

// WritePack stores blobs as one pack under its proper name.
func WritePack(ctx context.Context, s upload.Store, blobs []Blob) (string, error) {
	data, id := EncodePack(blobs)
	name := delta.PackName(id)
	return name, upload.PutBytes(ctx, s, name, data)
}

// WriteRecord stores a record with fsTree as the writable layer on top of
// parent (same sandbox, backend and base), as a later turn would. The
// catalog learns it at the next rebuild, as it would learn a record
// another host uploaded; the sandbox's head stays where it is.
func WriteRecord(ctx context.Context, s upload.Store, parent *delta.Checkpoint, fsTree delta.ID) (delta.ID, error) {
	cp := &delta.Checkpoint{
		Version: delta.RecordVersion, Sandbox: parent.Sandbox, Parent: parent.ID, Turn: parent.Turn + 1,
		Class: delta.ClassFS, Backend: parent.Backend, BaseTree: parent.BaseTree, FSTree: fsTree,
		StateKey: fsTree, Created: time.Now().UTC(),
	}
	data, id, err := delta.EncodeRecord(cp)
	if err != nil {
		return id, err
	}
	return id, upload.PutBytes(ctx, s, "records/"+id.String(), data)
}

// Case is one hostile writable layer: the blobs to store (in one pack) and
// the layer's root tree, with the words an error about it must contain.
type Case struct {
	Name  string
	Blobs []Blob
	Root  delta.ID
	Want  string // a fragment of the error every reader must return
}

// file is a file entry of the given chunks and declared size.
func file(name string, size uint64, chunks ...delta.ID) delta.Entry {
	return delta.Entry{Name: name, Type: delta.TypeFile, Mode: 0o644, Size: size, Chunks: chunks}
}

func layer(extra []Blob, entries ...delta.Entry) ([]Blob, delta.ID) {
	t := Tree(&delta.Tree{Entries: entries})
	return append(extra, t), t.ID
}

// ZstdBomb is a data blob declaring one 64 KiB chunk whose zstd frame
// inflates to inflated bytes of zeros.
func ZstdBomb(inflated int64) (Blob, error) {
	var frame bytes.Buffer
	w, err := zstd.NewWriter(&frame, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		return Blob{}, err
	}
	if _, err := io.Copy(w, io.LimitReader(zeros{}, inflated)); err != nil {
		return Blob{}, err
	}
	if err := w.Close(); err != nil {
		return Blob{}, err
	}
	return Blob{Type: delta.BlobData, ID: delta.Hash(make([]byte, delta.ChunkAverage)), Stored: frame.Bytes(),
		RawLength: delta.ChunkAverage, Compression: delta.CompressionZstd}, nil
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// DAGBomb is a layer of levels nested levels of fan directories, every
// directory of one level sharing one subtree: about fan^levels entries in
// a few kilobytes of trees.
func DAGBomb(fan, levels int) ([]Blob, delta.ID) {
	leaf := Tree(&delta.Tree{Entries: []delta.Entry{file("f", 0)}})
	blobs := []Blob{leaf}
	sub := leaf.ID
	for range levels {
		t := &delta.Tree{}
		for i := range fan {
			t.Entries = append(t.Entries, delta.Entry{Name: fmt.Sprintf("d%02d", i), Type: delta.TypeDir, Mode: 0o755, Subtree: sub})
		}
		b := Tree(t)
		blobs = append(blobs, b)
		sub = b.ID
	}
	return blobs, sub
}

// Cases returns one of each hostile layer a restore must refuse and verify
// must therefore refuse too. bomb is the inflated size of the zstd bomb.
func Cases(bomb int64) ([]Case, error) {
	hello := Plain(delta.BlobData, []byte("hello\n"))
	var cs []Case
	add := func(name, want string, blobs []Blob, root delta.ID) {
		cs = append(cs, Case{Name: name, Blobs: blobs, Root: root, Want: want})
	}
	zb, err := ZstdBomb(bomb)
	if err != nil {
		return nil, err
	}
	b, r := layer([]Blob{zb}, file("bomb", delta.ChunkAverage, zb.ID))
	add("zstd-bomb", "zstd", b, r)
	b, r = DAGBomb(16, 8)
	add("dag-bomb", "expands to more than", b, r)
	b, r = layer([]Blob{hello}, file("f", 7, hello.ID))
	add("size-not-sum-of-chunks", "chunks hold 6 bytes, entry says 7", b, r)
	b, r = layer([]Blob{hello}, file("f", 0, hello.ID))
	add("empty-file-with-chunks", "cannot be", b, r)
	b, r = layer([]Blob{hello}, file("f", 5, hello.ID))
	add("size-short-of-chunks", "chunks hold 6 bytes, entry says 5", b, r)
	b, r = layer([]Blob{hello},
		delta.Entry{Name: "a", Type: delta.TypeHardlink, Target: "b"}, file("b", 6, hello.ID))
	add("hardlink-to-later-entry", "does not come before it", b, r)
	b, r = layer([]Blob{hello}, delta.Entry{Name: "a", Type: delta.TypeHardlink, Target: "0"})
	add("hardlink-to-nothing", "not a file of this tree", b, r)
	f := file("f", 6, hello.ID)
	f.Xattrs = []delta.Xattr{{Name: "trusted.overlay.redirect", Value: []byte("/etc")}}
	b, r = layer([]Blob{hello}, f)
	add("overlay-xattr-in-layer", "overlayfs's own", b, r)
	b, r = layer(nil, delta.Entry{Name: "l", Type: delta.TypeSymlink, Mode: 0o777, Target: strings.Repeat("a/", 2500)})
	add("symlink-target-too-long", "target of 5000 bytes", b, r)
	f = file("f", 6, hello.ID)
	f.Xattrs = []delta.Xattr{{Name: "user.big", Value: make([]byte, delta.MaxXattrValue+1)}}
	b, r = layer([]Blob{hello}, f)
	add("xattr-value-too-long", "value of 65537 bytes", b, r)
	f = file("f", 6, hello.ID)
	f.Xattrs = []delta.Xattr{{Name: "user." + strings.Repeat("x", 300), Value: []byte("v")}}
	b, r = layer([]Blob{hello}, f)
	add("xattr-name-too-long", "xattr name of 305 bytes", b, r)
	// Sparse files (tree version 2) whose chunks cannot fill the data runs
	// their holes leave. (Hole lists that break rule 9 do not decode at
	// all; delta's tests and fuzz targets cover them.)
	sparse := func(size uint64, holes ...delta.Hole) delta.Entry {
		f := file("f", size, hello.ID)
		f.Holes = holes
		return f
	}
	b, r = layer([]Blob{hello}, sparse(1<<30, delta.Hole{Off: 0, Len: 1<<30 - 7}))
	add("sparse-chunks-short-of-data", "chunks hold 6 bytes, entry says 7", b, r)
	b, r = layer([]Blob{hello}, sparse(1<<40, delta.Hole{Off: 0, Len: 1 << 30}))
	add("sparse-data-beyond-chunks", "cannot be 1 chunks", b, r)
	return cs, nil
}

// LyingHeaders returns packs holding one real tree blob whose header
// declares raw_length as each hostile value (2^36, 2^62, 2^64-1).
func LyingHeaders() [][]Blob {
	var out [][]Blob
	for _, raw := range []uint64{1 << 36, 1 << 62, 1<<64 - 1} {
		t := Tree(&delta.Tree{})
		t.RawLength, t.Compression = raw, delta.CompressionZstd
		out = append(out, []Blob{t})
	}
	return out
}
