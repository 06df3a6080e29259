package delta

import (
	"bytes"
	"io"
	"math/rand"
	"testing"
)

func cutAll(t *testing.T, data []byte) [][]byte {
	t.Helper()
	var out [][]byte
	err := ChunkReader(bytes.NewReader(data), func(c []byte) error {
		out = append(out, bytes.Clone(c))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestFastCDCBoundsAndReassembly(t *testing.T) {
	data := make([]byte, 16<<20)
	rand.New(rand.NewSource(11)).Read(data)
	chunks := cutAll(t, data)
	if got := bytes.Join(chunks, nil); !bytes.Equal(got, data) {
		t.Fatal("chunks do not reassemble the input")
	}
	for i, c := range chunks {
		if len(c) > ChunkMax || (len(c) < ChunkMin && i != len(chunks)-1) {
			t.Fatalf("chunk %d is %d bytes, outside [%d, %d]", i, len(c), ChunkMin, ChunkMax)
		}
	}
	// Normalised chunking keeps the mean near the target on random data.
	mean := len(data) / len(chunks)
	if mean < ChunkAverage/2 || mean > 2*ChunkAverage {
		t.Fatalf("mean chunk %d bytes over %d chunks, want near %d", mean, len(chunks), ChunkAverage)
	}
	again := cutAll(t, data)
	if len(again) != len(chunks) {
		t.Fatal("chunking is not deterministic")
	}
}

// An insertion disturbs only the chunks around it: the property that makes
// an edit in a big file (or a few dirtied pages in a process image) cheap.
func TestFastCDCResistsShifts(t *testing.T) {
	data := make([]byte, 8<<20)
	rand.New(rand.NewSource(12)).Read(data)
	edited := append(append(append([]byte{}, data[:3<<20]...), []byte("ten bytes!")...), data[3<<20:]...)
	before := map[ID]bool{}
	for _, c := range cutAll(t, data) {
		before[Hash(c)] = true
	}
	var fresh int
	after := cutAll(t, edited)
	for _, c := range after {
		if !before[Hash(c)] {
			fresh++
		}
	}
	if fresh > 3 {
		t.Fatalf("a 10-byte insertion changed %d of %d chunks", fresh, len(after))
	}
}

// Readers that return short reads cut the same as one big read.
func TestFastCDCShortReads(t *testing.T) {
	data := make([]byte, 3<<20)
	rand.New(rand.NewSource(13)).Read(data)
	want := cutAll(t, data)
	var got [][]byte
	err := ChunkReader(&trickle{b: data}, func(c []byte) error { got = append(got, bytes.Clone(c)); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("short reads cut %d chunks, one read %d", len(got), len(want))
	}
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("chunk %d differs under short reads", i)
		}
	}
}

type trickle struct{ b []byte }

func (t *trickle) Read(p []byte) (int, error) {
	if len(t.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), 7777)], t.b)
	t.b = t.b[n:]
	return n, nil
}
