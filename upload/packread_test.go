package upload

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// TestReadPackHeader reads headers from a local store and counts the reads:
// a small pack's header must come in one ranged read, a large one's in two.
func TestReadPackHeader(t *testing.T) {
	local, err := NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		blobs, reads int
	}{{1, 1}, {40, 1}, {1000, 2}} {
		data, id, entries := buildPack(t, testBlobs(tc.blobs))
		if err := PutBytes(t.Context(), local, delta.PackName(id), data); err != nil {
			t.Fatal(err)
		}
		s := NewFaulty(local, FaultPlan{})
		got, err := delta.ReadPackHeader(t.Context(), Ranges(s), delta.PackName(id))
		if err != nil {
			t.Fatalf("%d blobs: %v", tc.blobs, err)
		}
		if !slices.Equal(got, entries) {
			t.Errorf("%d blobs: ReadPackHeader differs from Finish's entries", tc.blobs)
		}
		if n := s.Calls(OpGet); n != tc.reads {
			t.Errorf("%d blobs (%d-byte pack): %d reads, want %d", tc.blobs, len(data), n, tc.reads)
		}
	}
}

func TestReadPackHeaderErrors(t *testing.T) {
	ctx := t.Context()
	s, err := NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	name := delta.PackName(delta.Hash([]byte("missing")))
	if _, err := delta.ReadPackHeader(ctx, Ranges(s), name); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing pack: got error %v, want ErrNotFound", err)
	}
	data, _, _ := buildPack(t, testBlobs(10))
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"tiny", []byte("TSP")},
		{"truncated", data[:len(data)-1]},
		{"header cut", data[len(data)-20:]},
		{"flipped", func() []byte { b := slices.Clone(data); b[len(b)-10] ^= 0x40; return b }()},
	} {
		name := delta.PackName(delta.Hash([]byte(tc.name)))
		if err := PutBytes(ctx, s, name, tc.data); err != nil {
			t.Fatal(err)
		}
		_, err := delta.ReadPackHeader(ctx, Ranges(s), name)
		if !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: got error %v, want ErrCorrupt naming %s", tc.name, err, name)
		}
	}
	f := NewFaulty(s, FaultPlan{Fail: map[Op][]int{OpGet: {1}}})
	_, id, _ := buildPack(t, testBlobs(1))
	if err := PutBytes(ctx, s, delta.PackName(id), data); err != nil {
		t.Fatal(err)
	}
	if _, err := delta.ReadPackHeader(ctx, Ranges(f), delta.PackName(id)); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("store failure: got error %v, want ErrUnavailable", err)
	}
}

// testBlobs and buildPack make packs of n distinct blobs of mixed types,
// sizes and compressions, as delta's own pack tests do.
type testBlob struct {
	t      delta.BlobType
	stored []byte
	raw    int
	c      delta.Compression
}

func testBlobs(n int) []testBlob {
	var blobs []testBlob
	for i := range n {
		b := testBlob{t: delta.BlobData, stored: []byte(strings.Repeat(fmt.Sprint(i), i%300)), c: delta.CompressionNone}
		b.raw = len(b.stored)
		switch i % 3 {
		case 1:
			b.t = delta.BlobTree
		case 2:
			b.c, b.raw = delta.CompressionZstd, 1000+i // as if the stored bytes were a zstd frame
		}
		blobs = append(blobs, b)
	}
	return blobs
}

func buildPack(t testing.TB, blobs []testBlob) ([]byte, delta.ID, []delta.PackEntry) {
	t.Helper()
	w := delta.NewPackWriter()
	for i, b := range blobs {
		w.Add(b.t, delta.Hash(fmt.Appendf(nil, "blob %d", i)), b.stored, b.raw, b.c)
	}
	data, id, entries, err := w.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return data, id, entries
}
