package upload

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// maxSealedObject bounds a whole-sealed object read into memory: records,
// refs, sandbox, lock and journal objects are kilobytes; packs, the only
// large objects, are sealed blob by blob and pass through unread.
const maxSealedObject = 64 << 20

// sealedOverhead is what sealing adds to a whole object: magic, nonce, tag.
const sealedOverhead = 4 + delta.SealOverhead

// Sealed returns s with every object whose name delta.SealedName accepts
// sealed whole by k on Put and opened on Get (docs/FORMAT.md, "Encrypted
// stores"). Packs and key objects pass through as they are: the content
// repository seals packs blob by blob so that one blob is still read by
// range. Stat and List report the plaintext size of sealed objects, so
// that a copy from one sealed store to another (a push) moves what Get
// returns.
//
// With nil k the store is a plaintext one and passes everything through,
// except that Get of a sealed object fails with errdefs.ErrKey: a home
// without the key says so instead of reporting corruption.
func Sealed(s Store, k *delta.Keys) Store { return sealed{s, k} }

type sealed struct {
	s Store
	k *delta.Keys
}

func (z sealed) Put(ctx context.Context, name string, r io.Reader, size int64) error {
	if z.k == nil || !delta.SealedName(name) {
		return z.s.Put(ctx, name, r, size)
	}
	if size < 0 || size > maxSealedObject {
		return fmt.Errorf("object %s: %d bytes is beyond what is sealed whole: %w", name, size, errdefs.ErrInvalid)
	}
	plain := make([]byte, size)
	if _, err := io.ReadFull(r, plain); err != nil {
		return fmt.Errorf("object %s: shorter than its declared %d bytes: %w", name, size, errdefs.ErrInvalid)
	}
	if n, _ := r.Read(make([]byte, 1)); n > 0 {
		return fmt.Errorf("object %s: longer than its declared %d bytes: %w", name, size, errdefs.ErrInvalid)
	}
	b := z.k.SealObject(name, plain)
	return z.s.Put(ctx, name, bytes.NewReader(b), int64(len(b)))
}

func (z sealed) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	if !delta.SealedName(name) {
		return z.s.Get(ctx, name)
	}
	plain, err := z.open(ctx, name)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(plain)), nil
}

func (z sealed) open(ctx context.Context, name string) ([]byte, error) {
	rc, err := z.s.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	if z.k == nil {
		// Only the first bytes tell whether the object is sealed.
		head := make([]byte, 4)
		n, err := io.ReadFull(rc, head)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("object %s: %w", name, err)
		}
		if delta.IsSealedObject(head[:n]) {
			return nil, errNoKey(name)
		}
		rest, err := io.ReadAll(rc)
		if err != nil {
			return nil, fmt.Errorf("object %s: %w", name, err)
		}
		return append(head[:n], rest...), nil
	}
	data, err := io.ReadAll(io.LimitReader(rc, maxSealedObject+sealedOverhead+1))
	if err != nil {
		return nil, fmt.Errorf("object %s: %w", name, err)
	}
	if len(data) > maxSealedObject+sealedOverhead {
		return nil, fmt.Errorf("object %s: larger than any sealed object: %w", name, errdefs.ErrCorrupt)
	}
	return z.k.OpenObject(name, data)
}

// errNoKey: a plaintext home read a sealed object.
func errNoKey(name string) error {
	return fmt.Errorf("object %s is encrypted and this home has no key (`turnsnap init --key-file PATH`): %w", name, errdefs.ErrKey)
}

// GetRange reads packs by range from the store beneath; a sealed object is
// opened whole first (none is large).
func (z sealed) GetRange(ctx context.Context, name string, offset, length int64) (io.ReadCloser, error) {
	if z.k == nil || !delta.SealedName(name) {
		return GetRange(ctx, z.s, name, offset, length)
	}
	plain, err := z.open(ctx, name)
	if err != nil {
		return nil, err
	}
	if offset < 0 || length < 0 {
		return nil, fmt.Errorf("object %s: bad range %d+%d: %w", name, offset, length, errdefs.ErrInvalid)
	}
	plain = plain[min(offset, int64(len(plain))):]
	return io.NopCloser(bytes.NewReader(plain[:min(length, int64(len(plain)))])), nil
}

func (z sealed) plainInfo(oi ObjectInfo) ObjectInfo {
	if z.k != nil && delta.SealedName(oi.Name) && oi.Size >= sealedOverhead {
		oi.Size -= sealedOverhead
	}
	return oi
}

func (z sealed) Stat(ctx context.Context, name string) (ObjectInfo, error) {
	oi, err := z.s.Stat(ctx, name)
	return z.plainInfo(oi), err
}

func (z sealed) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	return z.s.List(ctx, prefix, func(oi ObjectInfo) error { return fn(z.plainInfo(oi)) })
}

func (z sealed) Delete(ctx context.Context, name string) error { return z.s.Delete(ctx, name) }
