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

// GetRange reads length bytes of name starting at offset, or fewer if the
// object ends first; callers that need exactly length bytes use io.ReadFull.
// It uses the store's RangeGetter when it has one, and otherwise reads the
// object from the start and discards the bytes before offset.
func GetRange(ctx context.Context, s Store, name string, offset, length int64) (io.ReadCloser, error) {
	if rg, ok := s.(RangeGetter); ok {
		return rg.GetRange(ctx, name, offset, length)
	}
	if offset < 0 || length < 0 {
		return nil, fmt.Errorf("object %s: bad range %d+%d: %w", name, offset, length, errdefs.ErrInvalid)
	}
	rc, err := s.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	if _, err := io.CopyN(io.Discard, rc, offset); err != nil && !errors.Is(err, io.EOF) {
		rc.Close()
		return nil, fmt.Errorf("object %s: skipping to offset %d: %w", name, offset, err)
	}
	return readCloser{io.LimitReader(rc, length), rc}, nil
}

// ReadAll returns the whole of object name.
func ReadAll(ctx context.Context, s Store, name string) ([]byte, error) {
	rc, err := s.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("object %s: %w", name, err)
	}
	return b, nil
}

// ReadAllMax is ReadAll for an object that may hold at most max bytes (a
// pack, a record, a ref): a larger one is corruption, found after reading
// max+1 bytes rather than after filling memory.
func ReadAllMax(ctx context.Context, s Store, name string, max int64) ([]byte, error) {
	rc, err := s.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, max+1))
	if err != nil {
		return nil, fmt.Errorf("object %s: %w", name, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("object %s: more than the %d bytes such an object may hold: %w", name, max, errdefs.ErrCorrupt)
	}
	return b, nil
}

// PutBytes stores b as object name.
func PutBytes(ctx context.Context, s Store, name string, b []byte) error {
	return s.Put(ctx, name, bytes.NewReader(b), int64(len(b)))
}

// readCloser reads from one thing and closes another, such as a section of
// an open file.
type readCloser struct {
	io.Reader
	io.Closer
}

// Ranges adapts s to the delta.RangeReader that delta.ReadPackHeader reads
// pack headers through.
func Ranges(s Store) delta.RangeReader { return ranges{s} }

type ranges struct{ s Store }

func (r ranges) ObjectSize(ctx context.Context, name string) (int64, error) {
	info, err := r.s.Stat(ctx, name)
	return info.Size, err
}

func (r ranges) ReadRange(ctx context.Context, name string, off, n int64) (io.ReadCloser, error) {
	return GetRange(ctx, r.s, name, off, n)
}
