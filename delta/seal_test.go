package delta

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// memRanges is a RangeReader over one in-memory object.
type memRanges map[string][]byte

func (m memRanges) ObjectSize(_ context.Context, name string) (int64, error) {
	d, ok := m[name]
	if !ok {
		return 0, errdefs.ErrNotFound
	}
	return int64(len(d)), nil
}

func (m memRanges) ReadRange(_ context.Context, name string, off, n int64) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(m[name][off : off+n])), nil
}

func sealedPack(t testing.TB, k *Keys, blobs ...string) ([]byte, ID, []PackEntry) {
	t.Helper()
	w := k.NewPackWriter()
	for i, b := range blobs {
		typ := BlobData
		if i%2 == 1 {
			typ = BlobTree
		}
		w.Add(typ, Hash([]byte(b)), []byte(b), len(b), CompressionNone)
	}
	data, id, entries, err := w.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return data, id, entries
}

func TestSealedPackRoundTrip(t *testing.T) {
	k := NewDataKey()
	secret := "marker-SECRET-in-a-blob-0123456789"
	data, id, entries := sealedPack(t, k, secret, "a tree blob", "third")
	if bytes.Contains(data, []byte(secret)) || bytes.Contains(data, []byte("a tree blob")) {
		t.Fatal("sealed pack holds a blob's plaintext")
	}
	for _, e := range entries {
		if bytes.Contains(data, e.ID[:]) {
			t.Fatalf("sealed pack holds blob ID %s in clear", e.ID.Short())
		}
	}
	got, err := k.ParsePackHeader(data)
	if err != nil || len(got) != 3 {
		t.Fatalf("ParsePackHeader: %v %v", got, err)
	}
	name := PackName(id)
	ranged, err := k.ReadPackHeader(context.Background(), memRanges{name: data}, name)
	if err != nil || len(ranged) != 3 {
		t.Fatalf("ReadPackHeader: %v %v", ranged, err)
	}
	e := ranged[0]
	plain, err := k.OpenBlob(e.Type, e.ID, data[e.Offset:e.Offset+e.Length])
	if err != nil || string(plain) != secret {
		t.Fatalf("OpenBlob by range: %q %v", plain, err)
	}
	// A blob opened as another entry's does not authenticate.
	if _, err := k.OpenBlob(ranged[1].Type, ranged[1].ID, data[e.Offset:e.Offset+e.Length]); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Errorf("blob opened under another entry: %v, want ErrCorrupt", err)
	}
}

func TestSealedPackWrongOrMissingKey(t *testing.T) {
	k := NewDataKey()
	data, _, _ := sealedPack(t, k, "x")
	if _, err := ParsePackHeader(data); !errors.Is(err, errdefs.ErrKey) {
		t.Errorf("no key: %v, want ErrKey", err)
	}
	if _, err := NewDataKey().ParsePackHeader(data); !errors.Is(err, errdefs.ErrKey) {
		t.Errorf("wrong key: %v, want ErrKey", err)
	}
	plain, _, _ := sealedPack(t, nil, "x")
	if _, err := k.ParsePackHeader(plain); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Errorf("plaintext pack read with a key: %v, want ErrCorrupt", err)
	}
	// Flipping any one byte of the sealed header is caught.
	for i := len(data) - 9; i > len(data)-60; i-- {
		bad := bytes.Clone(data)
		bad[i] ^= 1
		if _, err := k.ParsePackHeader(bad); err == nil {
			t.Fatalf("header byte %d flipped: no error", i)
		}
	}
}

func TestSealObject(t *testing.T) {
	k := NewDataKey()
	s := k.SealObject("refs/heads/a", []byte("secret ref"))
	if bytes.Contains(s, []byte("secret")) || !IsSealedObject(s) {
		t.Fatal("sealed object shows its plaintext or lacks its magic")
	}
	if p, err := k.OpenObject("refs/heads/a", s); err != nil || string(p) != "secret ref" {
		t.Fatalf("OpenObject: %q %v", p, err)
	}
	if _, err := k.OpenObject("refs/heads/b", s); !errors.Is(err, errdefs.ErrKey) {
		t.Errorf("object moved to another name: %v, want ErrKey", err)
	}
	if _, err := NewDataKey().OpenObject("refs/heads/a", s); !errors.Is(err, errdefs.ErrKey) {
		t.Errorf("wrong key: %v, want ErrKey", err)
	}
	if _, err := k.OpenObject("refs/heads/a", []byte("plain")); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Errorf("plaintext object: %v, want ErrCorrupt", err)
	}
}

func TestKeyWrapAndRotate(t *testing.T) {
	m1, m2 := GenerateMasterKey(), GenerateMasterKey()
	m, err := DecodeKeyFile(EncodeKeyFile(m1))
	if err != nil || m.ID() != m1.ID() {
		t.Fatalf("key file round trip: %v", err)
	}
	k := NewDataKey()
	obj := m1.WrapKeys(k)
	sealed := k.SealObject("records/x", []byte("data"))
	// Rotation: the same data key wrapped by a new master opens old objects.
	k2, err := m2.UnwrapKeys(m2.WrapKeys(mustUnwrap(t, m1, obj)))
	if err != nil {
		t.Fatal(err)
	}
	if p, err := k2.OpenObject("records/x", sealed); err != nil || string(p) != "data" {
		t.Fatalf("rotated key: %q %v", p, err)
	}
	if _, err := m2.UnwrapKeys(obj); !errors.Is(err, errdefs.ErrKey) {
		t.Errorf("wrong master: %v, want ErrKey", err)
	}
	if !bytes.Equal(k.CatalogKey(), k2.CatalogKey()) {
		t.Error("catalog key changed with the master key")
	}
	for _, bad := range []string{"", "{}", `{"version":1,"kind":"turnsnap-master-key","key":"AAAA"}`, "\x00"} {
		if _, err := DecodeKeyFile([]byte(bad)); !errors.Is(err, errdefs.ErrKey) {
			t.Errorf("key file %q: %v, want ErrKey", bad, err)
		}
	}
}

func mustUnwrap(t *testing.T, m *MasterKey, obj []byte) *Keys {
	k, err := m.UnwrapKeys(obj)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// fuzzKeys is one fixed data key, so that the corpus's sealed inputs open.
func fuzzKeys() *Keys { return newKeys([KeySize]byte{1, 2, 3}, false) }

func FuzzSealedPackHeader(f *testing.F) {
	k := fuzzKeys()
	data, _, _ := sealedPack(f, k, "one", "two")
	f.Add(data)
	f.Add([]byte("TSE1"))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := k.ParsePackHeader(data)
		if err != nil {
			if !errors.Is(err, errdefs.ErrCorrupt) && !errors.Is(err, errdefs.ErrKey) {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		for _, e := range entries {
			if e.Offset+e.Length > uint64(len(data)) || e.Length < SealOverhead {
				t.Fatalf("entry %+v outside a %d-byte pack", e, len(data))
			}
		}
	})
}

func FuzzOpenObject(f *testing.F) {
	k := fuzzKeys()
	f.Add(k.SealObject("records/a", []byte("x")))
	f.Add([]byte("TSX1"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := k.OpenObject("records/a", data); err != nil &&
			!errors.Is(err, errdefs.ErrCorrupt) && !errors.Is(err, errdefs.ErrKey) {
			t.Fatalf("unclassified error: %v", err)
		}
	})
}

func FuzzKeyFiles(f *testing.F) {
	m := &MasterKey{}
	f.Add(EncodeKeyFile(m), m.WrapKeys(fuzzKeys()))
	f.Add(EncodeKeyFile(m), m.WrapKeys(newKeys([KeySize]byte{1, 2, 3}, true)))
	f.Fuzz(func(t *testing.T, file, obj []byte) {
		if _, err := DecodeKeyFile(file); err != nil && !errors.Is(err, errdefs.ErrKey) {
			t.Fatalf("key file: unclassified error: %v", err)
		}
		if _, err := m.UnwrapKeys(obj); err != nil && !errors.Is(err, errdefs.ErrKey) && !errors.Is(err, errdefs.ErrCorrupt) {
			t.Fatalf("key object: unclassified error: %v", err)
		}
	})
}
