package upload_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// plainPack builds a plaintext pack named under ids holding blobs.
func plainPack(t *testing.T, k *delta.Keys, ids delta.IDs, blobs ...string) ([]byte, delta.ID) {
	t.Helper()
	w := delta.NewPackWriterFor(k, ids)
	for _, b := range blobs {
		w.Add(delta.BlobData, ids.Hash([]byte(b)), []byte(b), len(b), delta.CompressionNone)
	}
	data, id, _, err := w.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return data, id
}

func readRange(t *testing.T, s upload.Store, name string, off, n int64) []byte {
	t.Helper()
	rc, err := upload.GetRange(context.Background(), s, name, off, n)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A plaintext pack put through SealedRemote is sealed in the store beneath
// under the same name, and reads back as the very plaintext bytes, by
// Get, by range and through its header; tampering fails loudly.
func TestSealedRemotePacks(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	raw := newLocal(t, dir)
	k := delta.NewDataKey()
	s := upload.SealedRemote(raw, k)
	marker := "MARKER-plain-local-pack-9c1d"
	plain, id := plainPack(t, nil, k.IDs(), marker+" one", "two "+marker, "three")
	name := delta.PackName(id)
	if err := upload.PutBytes(ctx, s, name, plain); err != nil {
		t.Fatal(err)
	}
	stored, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(stored, []byte(marker)) || !bytes.HasSuffix(stored, []byte("TSE1")) {
		t.Fatal("the store beneath holds the plaintext pack, not a sealed one")
	}
	got, err := upload.ReadAll(ctx, s, name)
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("Get: %d bytes, %v; want the %d plaintext bytes", len(got), err, len(plain))
	}
	if oi, err := s.Stat(ctx, name); err != nil || oi.Size != int64(len(plain)) {
		t.Fatalf("Stat: %+v, %v; want size %d", oi, err, len(plain))
	}
	want, err := delta.ParsePackHeader(plain)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := delta.ReadPackHeader(ctx, upload.Ranges(s), name)
	if err != nil || !slices.Equal(entries, want) {
		t.Fatalf("header through the plaintext view: %v, %v; want %v", entries, err, want)
	}
	for _, r := range [][2]int64{{0, 5}, {int64(want[1].Offset), int64(want[1].Length)}, {int64(len(plain)) - 8, 8}, {int64(len(plain)) - 3, 100}} {
		if got := readRange(t, s, name, r[0], r[1]); !bytes.Equal(got, plain[r[0]:min(r[0]+r[1], int64(len(plain)))]) {
			t.Errorf("range %d+%d: %q", r[0], r[1], got)
		}
	}

	// A pack an encrypted-local home wrote (named by its sealed bytes)
	// reads back in the plaintext layout too.
	sealed, sid := plainPack(t, k, k.IDs(), "sealed one", "sealed two")
	if err := upload.PutBytes(ctx, raw, delta.PackName(sid), sealed); err != nil {
		t.Fatal(err)
	}
	if got, err := upload.ReadAll(ctx, s, delta.PackName(sid)); err != nil {
		t.Fatal(err)
	} else if _, err := delta.ParsePackHeader(got); err != nil {
		t.Fatalf("an encrypted-local pack read through SealedRemote: %v", err)
	}

	// A pack whose bytes are not its name's is refused on the way up.
	if err := upload.PutBytes(ctx, s, delta.PackName(delta.Hash([]byte("x"))), plain); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("put under another name: %v, want ErrCorrupt", err)
	}
	// Tampering with one sealed byte fails the read.
	stored[len(stored)/3] ^= 1
	if err := os.WriteFile(filepath.Join(dir, name), stored, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := upload.ReadAll(ctx, s, name); !errors.Is(err, errdefs.ErrCorrupt) && !errors.Is(err, errdefs.ErrKey) {
		t.Fatalf("tampered pack: %v, want ErrCorrupt or ErrKey", err)
	}

	// Whole objects are sealed as Sealed seals them.
	if err := upload.PutBytes(ctx, s, "records/r", []byte(marker)); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "records/r")); bytes.Contains(b, []byte(marker)) {
		t.Fatal("a record is in plaintext beneath SealedRemote")
	}
	if b, err := upload.ReadAll(ctx, s, "records/r"); err != nil || string(b) != marker {
		t.Fatalf("record: %q, %v", b, err)
	}
}
