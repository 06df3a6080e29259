package upload_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
	"github.com/turnsnap/turnsnap/upload/storetest"
)

// A sealed store keeps the Store contract.
func TestSealedStoreContract(t *testing.T) {
	k := delta.NewDataKey()
	storetest.Run(t, func(t *testing.T) upload.Store { return upload.Sealed(newLocal(t, t.TempDir()), k) })
}

func TestSealedStoreHidesAndRefuses(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	raw := newLocal(t, dir)
	k := delta.NewDataKey()
	s := upload.Sealed(raw, k)
	marker := []byte("MARKER-sealed-record-7f3a")
	if err := upload.PutBytes(ctx, s, "records/r1", marker); err != nil {
		t.Fatal(err)
	}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if b, _ := os.ReadFile(p); bytes.Contains(b, marker) {
				t.Errorf("%s holds the plaintext", p)
			}
		}
		return nil
	})
	if got, err := upload.ReadAll(ctx, s, "records/r1"); err != nil || !bytes.Equal(got, marker) {
		t.Fatalf("read back: %q %v", got, err)
	}
	if oi, err := s.Stat(ctx, "records/r1"); err != nil || oi.Size != int64(len(marker)) {
		t.Errorf("Stat: %+v %v, want the plaintext size", oi, err)
	}
	if _, err := upload.ReadAll(ctx, upload.Sealed(raw, delta.NewDataKey()), "records/r1"); !errors.Is(err, errdefs.ErrKey) {
		t.Errorf("wrong key: %v, want ErrKey", err)
	}
	// An object planted in plaintext by someone without the key is refused.
	if err := upload.PutBytes(ctx, raw, "refs/heads/x", []byte("planted\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := upload.ReadAll(ctx, s, "refs/heads/x"); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Errorf("planted plaintext: %v, want ErrCorrupt", err)
	}
}

// A plaintext home reading a sealed object says "key", not "corrupt";
// plaintext objects pass through it unchanged.
func TestPlainStoreRefusesSealed(t *testing.T) {
	ctx := context.Background()
	raw := newLocal(t, t.TempDir())
	if err := upload.PutBytes(ctx, upload.Sealed(raw, delta.NewDataKey()), "records/r", []byte("x")); err != nil {
		t.Fatal(err)
	}
	plain := upload.Sealed(raw, nil)
	if _, err := upload.ReadAll(ctx, plain, "records/r"); !errors.Is(err, errdefs.ErrKey) {
		t.Errorf("sealed object without a key: %v, want ErrKey", err)
	}
	if err := upload.PutBytes(ctx, plain, "refs/heads/a", []byte("ok\n")); err != nil {
		t.Fatal(err)
	}
	if b, err := upload.ReadAll(ctx, raw, "refs/heads/a"); err != nil || string(b) != "ok\n" {
		t.Errorf("plaintext passthrough: %q %v", b, err)
	}
}

func TestPlainStoreContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) upload.Store { return upload.Sealed(newLocal(t, t.TempDir()), nil) })
}
