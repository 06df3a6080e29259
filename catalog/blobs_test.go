package catalog

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// bulkN is well past one Badger transaction's limit for these entries, so the
// bulk calls must split their work.
const bulkN = 50000

func nthID(i int) delta.ID {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(i))
	return delta.Hash(b[:])
}

func TestPutBlobs(t *testing.T) {
	c := openTest(t)
	pack := delta.Hash([]byte("pack"))
	blobs := make(map[delta.ID]BlobLocation, bulkN)
	for i := 0; i < bulkN; i++ {
		blobs[nthID(i)] = BlobLocation{Pack: pack, Type: delta.BlobData, Offset: uint64(i) * 100, Length: 100, RawLength: 300, Compression: 1}
	}
	if err := c.PutBlobs(t.Context(), blobs); err != nil {
		t.Fatal(err)
	}
	view(t, c, func(tx *Tx) error {
		for id, want := range blobs {
			got, ok, err := tx.Blob(id)
			if err != nil || !ok || got != want {
				t.Fatalf("blob %s: %+v %v %v, want %+v", id, got, ok, err, want)
			}
		}
		if _, ok, err := tx.Blob(nthID(-1)); ok || err != nil {
			t.Errorf("unknown blob: %v %v", ok, err)
		}
		return nil
	})
	bad := map[delta.ID]BlobLocation{nthID(1): {Type: delta.BlobData}}
	if err := c.PutBlobs(t.Context(), bad); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("zero pack: %v", err)
	}
	bad = map[delta.ID]BlobLocation{nthID(1): {Pack: pack, Type: 9}}
	if err := c.PutBlobs(t.Context(), bad); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("unknown type: %v", err)
	}
}

func TestAddRefCounts(t *testing.T) {
	c := openTest(t)
	inc := make(map[delta.ID]int64, bulkN)
	for i := 0; i < bulkN; i++ {
		inc[nthID(i)] = int64(i%3 + 1)
	}
	if err := c.AddRefCounts(t.Context(), inc); err != nil {
		t.Fatal(err)
	}
	if err := c.AddRefCounts(t.Context(), inc); err != nil {
		t.Fatal(err)
	}
	dec := make(map[delta.ID]int64, bulkN)
	for id, d := range inc {
		dec[id] = -d
	}
	if err := c.AddRefCounts(t.Context(), dec); err != nil {
		t.Fatal(err)
	}
	view(t, c, func(tx *Tx) error {
		for id, d := range inc {
			if n, err := tx.RefCount(id); err != nil || n != d {
				t.Fatalf("refcount %s: %d %v, want %d", id, n, err, d)
			}
		}
		return nil
	})
	// Down to zero removes every count key.
	if err := c.AddRefCounts(t.Context(), dec); err != nil {
		t.Fatal(err)
	}
	view(t, c, func(tx *Tx) error {
		n := 0
		err := tx.scan([]byte{prefixRefCount}, false, func([]byte, []byte) error { n++; return nil })
		if err != nil || n != 0 {
			t.Errorf("%d count keys left at zero (%v)", n, err)
		}
		return nil
	})
	// Below zero is refused, naming the object.
	err := c.AddRefCounts(t.Context(), map[delta.ID]int64{nthID(7): -1})
	if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), nthID(7).String()) {
		t.Fatalf("below zero: %v", err)
	}
}

func TestAddRefCountNeverNegative(t *testing.T) {
	c := openTest(t)
	id := nthID(1)
	update(t, c, func(tx *Tx) error {
		if n, err := tx.AddRefCount(id, 2); err != nil || n != 2 {
			t.Errorf("add 2: %d %v", n, err)
		}
		return nil
	})
	err := c.Update(t.Context(), func(tx *Tx) error {
		_, err := tx.AddRefCount(id, -3)
		return err
	})
	if !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("2-3: %v", err)
	}
	update(t, c, func(tx *Tx) error {
		if n, err := tx.AddRefCount(id, -2); err != nil || n != 0 {
			t.Errorf("2-2: %d %v", n, err)
		}
		if _, err := tx.AddRefCount(id, -1); !errors.Is(err, errdefs.ErrPrecondition) {
			t.Errorf("0-1: %v", err)
		}
		return nil
	})
	view(t, c, func(tx *Tx) error {
		if n, err := tx.RefCount(id); err != nil || n != 0 {
			t.Errorf("final: %d %v", n, err)
		}
		return nil
	})
}
