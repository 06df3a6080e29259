// Package storetest is the conformance suite for upload.Store. Every
// implementation runs Run against fresh instances; passing it is what
// "implements the Store contract" means.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// Run runs the conformance suite. newStore must return a new, empty store
// each time it is called: every subtest makes its own, so none depends on
// another's leftovers.
func Run(t *testing.T, newStore func(t *testing.T) upload.Store) {
	tests := []struct {
		name string
		fn   func(*testing.T, upload.Store)
	}{
		{"RoundTrip", testRoundTrip},
		{"Overwrite", testOverwrite},
		{"Missing", testMissing},
		{"InvalidNames", testInvalidNames},
		{"SizeMismatch", testSizeMismatch},
		{"List", testList},
		{"ListStops", testListStops},
		{"Delete", testDelete},
		{"GetRange", testGetRange},
		{"Cancel", testCancel},
		{"ConcurrentPuts", testConcurrentPuts},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, newStore(t)) })
	}
}

// randBytes returns n bytes that depend only on seed, so a failure reproduces.
func randBytes(seed byte, n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{seed}).Read(b)
	return b
}

func put(t *testing.T, s upload.Store, name string, data []byte) {
	t.Helper()
	if err := upload.PutBytes(t.Context(), s, name, data); err != nil {
		t.Fatalf("Put %s: %v", name, err)
	}
}

// wantObject checks that name holds exactly data, by Get and by Stat.
func wantObject(t *testing.T, s upload.Store, name string, data []byte) {
	t.Helper()
	got, err := upload.ReadAll(t.Context(), s, name)
	if err != nil {
		t.Fatalf("Get %s: %v", name, err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("Get %s: got %d bytes, want %d bytes or other bytes", name, len(got), len(data))
	}
	info, err := s.Stat(t.Context(), name)
	if err != nil {
		t.Fatalf("Stat %s: %v", name, err)
	}
	if info.Name != name || info.Size != int64(len(data)) || info.ModTime.IsZero() {
		t.Fatalf("Stat %s = %+v, want name %s, size %d and a modification time", name, info, name, len(data))
	}
}

// wantAbsent checks that Get and Stat of name both report ErrNotFound.
func wantAbsent(t *testing.T, s upload.Store, name string) {
	t.Helper()
	if rc, err := s.Get(context.Background(), name); !errors.Is(err, errdefs.ErrNotFound) {
		if err == nil {
			rc.Close()
		}
		t.Fatalf("Get %s: got error %v, want ErrNotFound", name, err)
	}
	if _, err := s.Stat(context.Background(), name); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Stat %s: got error %v, want ErrNotFound", name, err)
	}
}

// list returns the names and sizes List gives for prefix, in its order.
func list(t *testing.T, s upload.Store, prefix string) []string {
	t.Helper()
	var got []string
	err := s.List(t.Context(), prefix, func(info upload.ObjectInfo) error {
		got = append(got, fmt.Sprintf("%s:%d", info.Name, info.Size))
		return nil
	})
	if err != nil {
		t.Fatalf("List %q: %v", prefix, err)
	}
	return got
}

// cancelReader cancels its context once it has given after bytes, then
// carries on giving bytes, as a caller that gives up mid-upload would.
type cancelReader struct {
	r      io.Reader
	after  int64
	read   int64
	cancel context.CancelFunc
}

func (c *cancelReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read += int64(n)
	if c.read >= c.after {
		c.cancel()
	}
	return n, err
}

// plainReader hides the extra methods of the reader it wraps (Len, WriterTo,
// Seek on a bytes.Reader), so a store cannot trust a length it did not read.
type plainReader struct{ r io.Reader }

func (p plainReader) Read(b []byte) (int, error) { return p.r.Read(b) }
