package upload

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// SealedRemote returns the remote store of a home whose local store is
// plaintext (--encrypt-local=false): what Get returns and Put takes is the
// plaintext form, what s holds is sealed by k (docs/FORMAT.md, "Encrypted
// stores"). Whole objects are sealed as Sealed seals them; a pack is
// resealed blob by blob on Put, under the same name (the keyed ID of its
// plaintext layout, which reveals nothing without the data key), and
// opened back into that layout on Get, every blob authenticated and the
// result checked against its name. Stat reports a pack's plaintext size
// (from its sealed header: two ranged reads), so that a tiered store
// copies in exactly what Get returns; List reports stored sizes.
func SealedRemote(s Store, k *delta.Keys) Store {
	return sealedPacks{sealed: sealed{s, k}, raw: s, k: k}
}

type sealedPacks struct {
	sealed
	raw Store
	k   *delta.Keys
}

func isPack(name string) bool { return strings.HasPrefix(name, delta.PackPrefix) }

func (z sealedPacks) Put(ctx context.Context, name string, r io.Reader, size int64) error {
	if !isPack(name) {
		return z.sealed.Put(ctx, name, r, size)
	}
	if size < 0 || size > delta.MaxPackSize {
		return fmt.Errorf("pack %s: %d bytes, more than a pack holds: %w", name, size, errdefs.ErrInvalid)
	}
	plain := make([]byte, size)
	if _, err := io.ReadFull(r, plain); err != nil {
		return fmt.Errorf("pack %s: shorter than its declared %d bytes: %w", name, size, errdefs.ErrInvalid)
	}
	// The local copy was checked when it was read; a pack that is not the
	// one its name says must not be sealed and passed off as it.
	if id, ok := delta.ParsePackName(name); !ok || z.k.IDs().Hash(plain) != id {
		return fmt.Errorf("pack %s: the local copy does not hash to its name: %w", name, errdefs.ErrCorrupt)
	}
	data, err := z.k.SealPack(plain)
	if err != nil {
		return fmt.Errorf("pack %s: %w", name, err)
	}
	return z.raw.Put(ctx, name, bytes.NewReader(data), int64(len(data)))
}

// open reads pack name whole and returns its plaintext layout.
func (z sealedPacks) open(ctx context.Context, name string) ([]byte, error) {
	id, ok := delta.ParsePackName(name)
	if !ok {
		return nil, fmt.Errorf("object %s: not a pack name: %w", name, errdefs.ErrInvalid)
	}
	data, err := ReadAllMax(ctx, z.raw, name, delta.MaxPackSize)
	if err != nil {
		return nil, err
	}
	plain, err := z.k.UnsealPack(data)
	if err != nil {
		return nil, fmt.Errorf("object %s: %w", name, err)
	}
	// Named by its plaintext layout (a plaintext-local writer) or by its
	// sealed bytes (an encrypted-local one): either way it is the pack.
	if ids := z.k.IDs(); ids.Hash(plain) != id && ids.Hash(data) != id {
		return nil, fmt.Errorf("object %s: content hashes to neither its name nor its plaintext's: %w", name, errdefs.ErrCorrupt)
	}
	return plain, nil
}

func (z sealedPacks) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	if !isPack(name) {
		return z.sealed.Get(ctx, name)
	}
	plain, err := z.open(ctx, name)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(plain)), nil
}

// tail returns where pack name's plaintext header starts, and its header
// and footer, from the sealed header alone.
func (z sealedPacks) tail(ctx context.Context, name string) (int64, []byte, error) {
	entries, err := z.k.ReadPackHeader(ctx, Ranges(z.raw), name)
	if err != nil {
		return 0, nil, err
	}
	n, tail, err := z.k.PlainPackTail(entries)
	if err != nil {
		return 0, nil, fmt.Errorf("pack %s: %w", name, err)
	}
	return n, tail, nil
}

// GetRange serves a range in a pack's header and footer (what a catalog
// rebuild reads) from the sealed header, and any other range from the
// whole pack opened.
func (z sealedPacks) GetRange(ctx context.Context, name string, offset, length int64) (io.ReadCloser, error) {
	if !isPack(name) {
		return z.sealed.GetRange(ctx, name, offset, length)
	}
	if offset < 0 || length < 0 {
		return nil, fmt.Errorf("object %s: bad range %d+%d: %w", name, offset, length, errdefs.ErrInvalid)
	}
	n, tail, err := z.tail(ctx, name)
	if err != nil {
		return nil, err
	}
	if offset >= n {
		tail = tail[min(offset-n, int64(len(tail))):]
		return io.NopCloser(bytes.NewReader(tail[:min(length, int64(len(tail)))])), nil
	}
	plain, err := z.open(ctx, name)
	if err != nil {
		return nil, err
	}
	plain = plain[min(offset, int64(len(plain))):]
	return io.NopCloser(bytes.NewReader(plain[:min(length, int64(len(plain)))])), nil
}

func (z sealedPacks) Stat(ctx context.Context, name string) (ObjectInfo, error) {
	if !isPack(name) {
		return z.sealed.Stat(ctx, name)
	}
	oi, err := z.raw.Stat(ctx, name)
	if err != nil {
		return oi, err
	}
	n, tail, err := z.tail(ctx, name)
	if err != nil {
		return ObjectInfo{}, err
	}
	oi.Size = n + int64(len(tail))
	return oi, nil
}
