package hostile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// loader serves blobs through delta's one blob decoder (DecodeBlob), as a
// repository reading them out of packs would.
type loader struct {
	codec *delta.Codec
	blobs map[delta.ID]Blob
}

func newLoader(t *testing.T, blobs []Blob) *loader {
	t.Helper()
	c, err := delta.NewCodec()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	l := &loader{codec: c, blobs: map[delta.ID]Blob{}}
	for _, b := range blobs {
		l.blobs[b.ID] = b
	}
	return l
}

func (l *loader) LoadBlob(_ context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	b, ok := l.blobs[id]
	if !ok || b.Type != t {
		return nil, fmt.Errorf("%s blob %s: %w", t, id.Short(), errdefs.ErrNotFound)
	}
	return l.codec.DecodeBlob(delta.IDs{}, t, id, b.Compression == delta.CompressionZstd, b.RawLength, b.Stored)
}

// chunkSize reads a chunk in full, as a restore does before it trusts it.
func (l *loader) chunkSize(id delta.ID) (uint64, error) {
	data, err := l.LoadBlob(context.Background(), delta.BlobData, id)
	return uint64(len(data)), err
}

func (l *loader) check(root delta.ID) error {
	_, err := delta.CheckState(context.Background(), l, root, delta.StateRules{ChunkSize: l.chunkSize})
	return err
}

// The pack format EncodePack writes is the one delta reads: a pack of
// honest blobs parses, and each blob decodes to its content.
func TestEncodePackParses(t *testing.T) {
	hello := Plain(delta.BlobData, []byte("hello\n"))
	tree := Tree(&delta.Tree{Entries: []delta.Entry{file("f", 6, hello.ID)}})
	data, id := EncodePack([]Blob{hello, tree})
	if id != delta.Hash(data) {
		t.Fatal("the pack's ID is not the hash of its bytes")
	}
	entries, err := delta.ParsePackHeader(data)
	if err != nil {
		t.Fatalf("an honest pack does not parse: %v", err)
	}
	if len(entries) != 2 || entries[0].ID != hello.ID || entries[0].Type != delta.BlobData || entries[0].RawLength != 6 ||
		entries[1].ID != tree.ID || entries[1].Type != delta.BlobTree {
		t.Fatalf("entries %+v", entries)
	}
	got := data[entries[0].Offset : entries[0].Offset+entries[0].Length]
	if !bytes.Equal(got, []byte("hello\n")) {
		t.Fatalf("blob 0 stored as %q", got)
	}
	// The same harness accepts an honest layer: the rejections below are
	// the cases', not the harness's.
	if err := newLoader(t, []Blob{hello, tree}).check(tree.ID); err != nil {
		t.Fatalf("an honest layer is refused: %v", err)
	}
}

// Headers that declare impossible plaintext lengths are corrupt to delta's
// pack parser.
func TestLyingHeadersCorrupt(t *testing.T) {
	for _, blobs := range LyingHeaders() {
		data, _ := EncodePack(blobs)
		_, err := delta.ParsePackHeader(data)
		if !errors.Is(err, errdefs.ErrCorrupt) {
			t.Errorf("raw length %d: ParsePackHeader says %v, want ErrCorrupt", blobs[0].RawLength, err)
		}
	}
}

// Every hostile layer is well-formed as a pack, and refused by delta's
// state rules (the ones every restore and verify apply) with ErrCorrupt and
// the words the case promises.
func TestCasesRejected(t *testing.T) {
	cases, err := Cases(64 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) < 10 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			data, _ := EncodePack(c.Blobs)
			if _, err := delta.ParsePackHeader(data); err != nil {
				t.Fatalf("the case's pack itself is refused, so its layer is never reached: %v", err)
			}
			err := newLoader(t, c.Blobs).check(c.Root)
			if !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), c.Want) {
				t.Fatalf("CheckState: %v; want ErrCorrupt containing %q", err, c.Want)
			}
		})
	}
}

// The zstd bomb inflates past what it declares, and DecodeBlob stops it.
func TestZstdBomb(t *testing.T) {
	b, err := ZstdBomb(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Stored) > 64<<10 {
		t.Fatalf("an 8 MiB bomb takes %d bytes: not a bomb", len(b.Stored))
	}
	if _, err := newLoader(t, []Blob{b}).chunkSize(b.ID); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("decoding the bomb: %v, want ErrCorrupt", err)
	}
}
