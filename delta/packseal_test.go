package delta

import (
	"bytes"
	"errors"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// A plaintext pack sealed and opened again is the very same bytes, under
// the same keyed name, and its plaintext tail is computed from the sealed
// header alone.
func TestPackSealRoundTrip(t *testing.T) {
	k := NewDataKey()
	w := NewPackWriterFor(nil, k.IDs())
	for _, b := range []string{"one", "a somewhat longer blob", "three"} {
		w.Add(BlobData, k.IDs().Hash([]byte(b)), []byte(b), len(b), CompressionNone)
	}
	plain, id, _, err := w.Finish()
	if err != nil {
		t.Fatal(err)
	}
	if id != k.IDs().Hash(plain) || id == Hash(plain) {
		t.Fatal("a plaintext pack of a keyed home is not named by its keyed ID")
	}
	sealed, err := k.SealPack(plain)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("somewhat longer")) {
		t.Fatal("the sealed pack holds plaintext")
	}
	back, err := k.UnsealPack(sealed)
	if err != nil || !bytes.Equal(back, plain) {
		t.Fatalf("unsealed pack differs from the plaintext one (%v)", err)
	}
	entries, err := k.ParsePackHeader(sealed)
	if err != nil {
		t.Fatal(err)
	}
	n, tail, err := k.PlainPackTail(entries)
	if err != nil || !bytes.Equal(plain[n:], tail) {
		t.Fatalf("plaintext tail from the sealed header: %d, %v", n, err)
	}
	for _, c := range []struct {
		keys *Keys
		data []byte
	}{{nil, plain}, {k, sealed}} {
		if _, err := c.keys.CheckPackName(k.IDs(), id, c.data); err != nil {
			t.Errorf("CheckPackName: %v", err)
		}
	}
	if _, err := k.CheckPackName(IDs{}, id, sealed); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Errorf("pack checked under the plain scheme: %v, want ErrCorrupt", err)
	}
	if _, err := NewDataKey().UnsealPack(sealed); !errors.Is(err, errdefs.ErrKey) {
		t.Errorf("unseal with another key: %v, want ErrKey", err)
	}
}

// UnsealPack reads store bytes: anything it accepts seals and opens back
// to itself, anything else is classified.
func FuzzUnsealPack(f *testing.F) {
	k := fuzzKeys()
	data, _, _ := sealedPack(f, k, "one", "two")
	f.Add(data)
	f.Add([]byte("TSE1"))
	f.Fuzz(func(t *testing.T, data []byte) {
		plain, err := k.UnsealPack(data)
		if err != nil {
			if !errors.Is(err, errdefs.ErrCorrupt) && !errors.Is(err, errdefs.ErrKey) && !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		sealed, err := k.SealPack(plain)
		if err != nil {
			t.Fatalf("an opened pack does not seal again: %v", err)
		}
		again, err := k.UnsealPack(sealed)
		if err != nil || !bytes.Equal(again, plain) {
			t.Fatalf("round trip differs (%v)", err)
		}
	})
}
