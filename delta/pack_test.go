package delta

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// TestPackGolden pins the byte layout documented at the top of pack.go.
func TestPackGolden(t *testing.T) {
	w := NewPackWriter()
	id := Hash([]byte("hi"))
	w.Add(BlobData, id, []byte("hi"), 2, CompressionNone)
	data, packID, _, err := w.Finish()
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("hi")             // Blob_1
	want = append(want, 1)           // n
	want = append(want, 1)           // type: data
	want = append(want, id[:]...)    // ID
	want = append(want, 0, 2, 2)     // offset, length, raw length
	want = append(want, 0)           // compression: none
	want = append(want, 38, 0, 0, 0) // len(Header), little-endian
	want = append(want, "TSP1"...)   // magic
	if !bytes.Equal(data, want) {
		t.Fatalf("pack bytes:\n got %x\nwant %x", data, want)
	}
	if packID != Hash(want) {
		t.Errorf("pack ID %s is not the hash of the pack", packID)
	}
}

type testBlob struct {
	t      BlobType
	stored []byte
	raw    int
	c      Compression
}

func testBlobs(n int) []testBlob {
	var blobs []testBlob
	for i := range n {
		b := testBlob{t: BlobData, stored: []byte(strings.Repeat(fmt.Sprint(i), i%300)), c: CompressionNone}
		b.raw = len(b.stored)
		switch i % 3 {
		case 1:
			b.t = BlobTree
		case 2:
			b.c, b.raw = CompressionZstd, 1000+i // as if the stored bytes were a zstd frame
		}
		blobs = append(blobs, b)
	}
	return blobs
}

// blobID gives each test blob a distinct ID, even when contents repeat.
func blobID(i int) ID { return Hash(fmt.Appendf(nil, "blob %d", i)) }

func buildPack(t testing.TB, blobs []testBlob) ([]byte, ID, []PackEntry) {
	t.Helper()
	w := NewPackWriter()
	for i, b := range blobs {
		w.Add(b.t, blobID(i), b.stored, b.raw, b.c)
	}
	data, id, entries, err := w.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return data, id, entries
}

func TestPackRoundTrip(t *testing.T) {
	blobs := testBlobs(50)
	w := NewPackWriter()
	total := 0
	for i, b := range blobs {
		if w.Has(blobID(i)) {
			t.Fatalf("Has(blob %d) before Add", i)
		}
		w.Add(b.t, blobID(i), b.stored, b.raw, b.c)
		total += len(b.stored)
		if !w.Has(blobID(i)) || w.Count() != i+1 || w.Len() != total {
			t.Fatalf("after Add #%d: Has %v, Count %d, Len %d; want true, %d, %d", i, w.Has(blobID(i)), w.Count(), w.Len(), i+1, total)
		}
	}
	data, id, entries, err := w.Finish()
	if err != nil {
		t.Fatal(err)
	}
	if id != Hash(data) {
		t.Errorf("Finish: ID %s is not the hash of the pack", id)
	}
	got, err := ParsePackHeader(data)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, entries) {
		t.Fatalf("ParsePackHeader differs from Finish's entries")
	}
	for i, e := range got {
		b := blobs[i]
		want := PackEntry{Type: b.t, ID: blobID(i), Offset: e.Offset, Length: uint64(len(b.stored)), RawLength: uint64(b.raw), Compression: b.c}
		if e != want || !bytes.Equal(data[e.Offset:e.Offset+e.Length], b.stored) {
			t.Errorf("entry %d = %+v, want %+v and its bytes", i, e, want)
		}
	}
	if pid, ok := ParsePackName(PackName(id)); !ok || pid != id {
		t.Errorf("ParsePackName(PackName(%s)) = %s, %v", id, pid, ok)
	}
}

func TestParsePackName(t *testing.T) {
	id := Hash([]byte("x"))
	h := id.String()
	if got := PackName(id); got != "packs/"+h[:2]+"/"+h {
		t.Errorf("PackName = %s", got)
	}
	for _, name := range []string{"", "packs/", "packs/" + h, "packs/00/" + h, "packs/" + h[:2] + "/" + strings.ToUpper(h),
		"packs/" + h[:2] + "/" + h + "x", "records/" + h[:2] + "/" + h, "packs/" + h[:2] + "/" + h[:63]} {
		if _, ok := ParsePackName(name); ok {
			t.Errorf("ParsePackName(%q) accepted", name)
		}
	}
}

func TestPackWriterMisuse(t *testing.T) {
	id := blobID(0)
	for _, tc := range []struct {
		name string
		use  func(w *PackWriter)
	}{
		{"empty", func(w *PackWriter) {}},
		{"unknown type", func(w *PackWriter) { w.Add(7, id, []byte("x"), 1, CompressionNone) }},
		{"unknown compression", func(w *PackWriter) { w.Add(BlobData, id, []byte("x"), 1, 9) }},
		{"raw length", func(w *PackWriter) { w.Add(BlobData, id, []byte("x"), 2, CompressionNone) }},
		{"negative raw length", func(w *PackWriter) { w.Add(BlobData, id, []byte("x"), -1, CompressionZstd) }},
		{"duplicate", func(w *PackWriter) {
			w.Add(BlobData, id, []byte("x"), 1, CompressionNone)
			w.Add(BlobData, id, []byte("x"), 1, CompressionNone)
		}},
	} {
		w := NewPackWriter()
		tc.use(w)
		if _, _, _, err := w.Finish(); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: Finish gave error %v, want ErrInvalid", tc.name, err)
		}
	}
	w := NewPackWriter()
	w.Add(BlobData, id, []byte("x"), 1, CompressionNone)
	if _, _, _, err := w.Finish(); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := w.Finish(); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("second Finish: got error %v, want ErrInvalid", err)
	}
}

// TestVerifyPack checks the check Finish makes: a header that decodes to
// anything but what was meant is an error.
func TestVerifyPack(t *testing.T) {
	data, id, entries := buildPack(t, testBlobs(5))
	if err := (*Keys)(nil).verifyPack(data, id, entries); err != nil {
		t.Fatal(err)
	}
	bad := slices.Clone(entries)
	bad[3].RawLength++
	if err := (*Keys)(nil).verifyPack(data, id, bad); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Errorf("verifyPack with other entries: got error %v, want ErrCorrupt", err)
	}
	if err := (*Keys)(nil).verifyPack(data[:len(data)-1], id, entries); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Errorf("verifyPack of a truncated pack: got error %v, want ErrCorrupt", err)
	}
}

// rawPack encodes a pack without PackWriter's checks, from blob bytes, a
// header and a header length to put in the footer.
func rawPack(blobs, header []byte, hlen int, magic string) []byte {
	p := append(slices.Clone(blobs), header...)
	p = binary.LittleEndian.AppendUint32(p, uint32(hlen))
	return append(p, magic...)
}

func entry(typ BlobType, i int, off, n, raw uint64, c Compression) PackEntry {
	return PackEntry{Type: typ, ID: blobID(i), Offset: off, Length: n, RawLength: raw, Compression: c}
}

func TestParsePackHeaderCorrupt(t *testing.T) {
	blobs := []byte("01234567")
	good := []PackEntry{entry(BlobData, 0, 0, 4, 4, CompressionNone), entry(BlobTree, 1, 4, 4, 9, CompressionZstd)}
	withHeader := func(es ...PackEntry) []byte {
		h := appendHeader(nil, es)
		return rawPack(blobs, h, len(h), packMagic)
	}
	if _, err := ParsePackHeader(withHeader(good...)); err != nil {
		t.Fatalf("the well-formed base case: %v", err)
	}
	goodHeader := appendHeader(nil, good)
	badVarint := append([]byte{1, byte(BlobData)}, blobID(0).String()[:32]...)
	badVarint = append(badVarint, bytes.Repeat([]byte{0xff}, 11)...)
	for _, tc := range []struct {
		name string
		pack []byte
	}{
		{"empty", nil},
		{"too short", []byte("TSP1")},
		{"bad magic", rawPack(blobs, goodHeader, len(goodHeader), "TSP2")},
		{"header longer than pack", rawPack(blobs, goodHeader, 1000, packMagic)},
		{"header length zero", rawPack(blobs, goodHeader, 0, packMagic)},
		{"header length short", rawPack(blobs, goodHeader, len(goodHeader)-1, packMagic)},
		{"count too large", rawPack(blobs, append([]byte{3}, goodHeader[1:]...), len(goodHeader), packMagic)},
		{"truncated entry", rawPack(blobs, goodHeader[:len(goodHeader)-1], len(goodHeader)-1, packMagic)},
		{"bad varint", rawPack(nil, badVarint, len(badVarint), packMagic)},
		{"trailing header bytes", rawPack(blobs, append(slices.Clone(goodHeader), 0), len(goodHeader)+1, packMagic)},
		{"unknown type", withHeader(good[0], entry(3, 1, 4, 4, 4, CompressionNone))},
		{"unknown compression", withHeader(good[0], entry(BlobTree, 1, 4, 4, 4, 2))},
		{"overlap", withHeader(good[0], entry(BlobTree, 1, 2, 4, 4, CompressionNone))},
		{"gap", withHeader(entry(BlobData, 0, 0, 2, 2, CompressionNone), good[1])},
		{"first blob not at 0", withHeader(entry(BlobData, 0, 1, 7, 7, CompressionNone))},
		{"out of range", withHeader(good[0], entry(BlobTree, 1, 4, 100, 100, CompressionNone))},
		{"length overflows", withHeader(good[0], entry(BlobTree, 1, 4, 1<<64-1, 1, CompressionZstd))},
		{"blobs end early", withHeader(good[0])},
		{"raw length of uncompressed", withHeader(good[0], entry(BlobTree, 1, 4, 4, 5, CompressionNone))},
		{"duplicate", withHeader(good[0], entry(BlobTree, 0, 4, 4, 4, CompressionNone))},
	} {
		_, err := ParsePackHeader(tc.pack)
		if !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), "pack ") {
			t.Errorf("%s: got error %v, want ErrCorrupt naming the pack", tc.name, err)
		}
	}
}

// TestPackHeaderByteFlips changes each byte of a small pack's header and
// footer in a few ways: each change must be caught or at least change what
// the header says, and none may panic.
func TestPackHeaderByteFlips(t *testing.T) {
	data, _, entries := buildPack(t, testBlobs(4))
	start := int(entries[len(entries)-1].Offset + entries[len(entries)-1].Length)
	for i := start; i < len(data); i++ {
		for _, x := range []byte{0x01, 0x02, 0x40, 0x80, 0xff} {
			bad := slices.Clone(data)
			bad[i] ^= x
			got, err := ParsePackHeader(bad)
			if err == nil && slices.Equal(got, entries) {
				t.Errorf("byte %d ^ %#x: parses to the original header", i, x)
			}
			if err != nil && !errors.Is(err, errdefs.ErrCorrupt) {
				t.Errorf("byte %d ^ %#x: error %v does not wrap ErrCorrupt", i, x, err)
			}
		}
	}
}

func FuzzParsePackHeader(f *testing.F) {
	data, _, _ := buildPack(f, testBlobs(3))
	f.Add(data)
	f.Add([]byte{})
	f.Add([]byte("TSP1"))
	f.Add(rawPack(nil, []byte{0}, 1, packMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := ParsePackHeader(data)
		if err != nil {
			if !errors.Is(err, errdefs.ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		var next uint64
		for i, e := range entries {
			if e.Offset != next || e.Offset+e.Length > uint64(len(data)) {
				t.Fatalf("entry %d = %+v accepted out of place", i, e)
			}
			next = e.Offset + e.Length
		}
	})
}

// FuzzReadPackBlobs goes past the header: every entry a header accepts is
// decoded through the blob decoder readers use, so a pack's declared
// lengths, compressions and frames meet the same bounds a restore does.
func FuzzReadPackBlobs(f *testing.F) {
	codec, err := NewCodec()
	if err != nil {
		f.Fatal(err)
	}
	defer codec.Close()
	data, _, _ := buildPack(f, testBlobs(3))
	f.Add(data)
	plain := bytes.Repeat([]byte("compressible "), 100)
	frame, _ := codec.Compress(nil, plain)
	w := NewPackWriter()
	w.Add(BlobData, Hash(plain), frame, len(plain), CompressionZstd)
	zdata, _, _, err := w.Finish()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(zdata)
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := ParsePackHeader(data)
		if err != nil {
			return
		}
		for _, e := range entries {
			stored := data[e.Offset : e.Offset+e.Length]
			out, err := codec.DecodeBlob(IDs{}, e.Type, e.ID, e.Compression == CompressionZstd, e.RawLength, stored)
			if err != nil {
				if !errors.Is(err, errdefs.ErrCorrupt) {
					t.Fatalf("blob %s: error %v does not wrap ErrCorrupt", e.ID, err)
				}
				continue
			}
			if uint64(len(out)) != e.RawLength || Hash(out) != e.ID {
				t.Fatalf("blob %s: accepted a plaintext that is not the blob", e.ID)
			}
		}
	})
}

// Absorb makes one pack of two writers' blobs: plaintext, the same bytes as
// one writer adding them all in that order; sealed, every blob opens at
// its new offset. Writers sharing a blob are left as they were; misuse is
// sticky.
func TestPackWriterAbsorb(t *testing.T) {
	blobs := testBlobs(12)
	fill := func(w *PackWriter, from, to int) {
		for i := from; i < to; i++ {
			w.Add(blobs[i].t, blobID(i), blobs[i].stored, blobs[i].raw, blobs[i].c)
		}
	}
	one := NewPackWriter()
	fill(one, 0, len(blobs))
	want, wantID, _, err := one.Finish()
	if err != nil {
		t.Fatal(err)
	}
	a, b := NewPackWriter(), NewPackWriter()
	fill(a, 0, 5)
	fill(b, 5, len(blobs))
	if !a.Absorb(b) {
		t.Fatal("Absorb refused two writers without a shared blob")
	}
	if a.Count() != len(blobs) || b.Count() != 0 || b.Len() != 0 || b.Has(blobID(5)) || !a.Has(blobID(11)) {
		t.Fatalf("after Absorb: counts %d and %d", a.Count(), b.Count())
	}
	got, id, _, err := a.Finish()
	if err != nil || id != wantID || !bytes.Equal(got, want) {
		t.Fatalf("absorbed pack differs from one written whole (%v)", err)
	}

	k := NewDataKey()
	a, b = k.NewPackWriter(), k.NewPackWriter()
	fill(a, 0, 5)
	fill(b, 5, len(blobs))
	if !a.Absorb(b) {
		t.Fatal("Absorb refused two sealed writers")
	}
	sealed, _, entries, err := a.Finish()
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := k.ParsePackHeader(sealed)
	if err != nil || !slices.Equal(parsed, entries) {
		t.Fatalf("sealed header: %v", err)
	}
	for i, e := range parsed {
		out, err := k.OpenBlob(e.Type, e.ID, sealed[e.Offset:e.Offset+e.Length])
		if err != nil || e.ID != blobID(i) || !bytes.Equal(out, blobs[i].stored) {
			t.Fatalf("blob %d after Absorb: %v", i, err)
		}
	}

	a, b = NewPackWriter(), NewPackWriter()
	fill(a, 0, 2)
	fill(b, 1, 3)
	if a.Absorb(b) || a.Count() != 2 || b.Count() != 2 {
		t.Fatalf("writers sharing a blob: absorbed, or changed (%d and %d blobs)", a.Count(), b.Count())
	}
	if _, _, _, err := a.Finish(); err != nil {
		t.Fatalf("a refused Absorb spoilt the writer: %v", err)
	}
	for name, c := range map[string]func() (*PackWriter, *PackWriter){
		"other keys": func() (*PackWriter, *PackWriter) {
			a, b := k.NewPackWriter(), NewDataKey().NewPackWriter()
			fill(a, 0, 1)
			fill(b, 1, 2)
			return a, b
		},
		"finished": func() (*PackWriter, *PackWriter) {
			a, b := NewPackWriter(), NewPackWriter()
			fill(a, 0, 1)
			fill(b, 1, 2)
			b.Finish()
			return a, b
		},
	} {
		a, b := c()
		a.Absorb(b)
		if _, _, _, err := a.Finish(); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: Finish after a bad Absorb: %v, want ErrInvalid", name, err)
		}
	}
}
