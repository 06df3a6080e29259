package upload

import (
	"context"
	"errors"
	"fmt"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Put writes to a temporary file, fsyncs it, renames it into place and
// fsyncs the directories involved: a reader sees the old object or the whole
// new one, and after Put returns the new one survives a crash.
func (s *localStore) Put(ctx context.Context, name string, r io.Reader, size int64) (err error) {
	if err := s.check(name); err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("object %s: negative size %d: %w", name, size, errdefs.ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("object %s: %w", name, err)
	}
	f, err := os.CreateTemp(filepath.Join(s.dir, tmpDir), "put-*")
	if err != nil {
		return fmt.Errorf("object %s: %w", name, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()      // may already be closed; the error is moot
			os.Remove(tmp) // gone already if the rename happened
		}
	}()
	if err := copyExactly(ctx, f, r, size); err != nil {
		return fmt.Errorf("object %s: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("object %s: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("object %s: %w", name, err)
	}
	// Last chance to honour a cancel: after the rename the object is in.
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("object %s: %w", name, err)
	}
	path := s.path(name)
	parent := filepath.Dir(path)
	// The parent is nearly always there already: make it only when the
	// rename says it is missing (a stat per Put was a tenth of a small
	// object's cost).
	if err := os.Rename(tmp, path); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(parent, 0o700); err != nil {
			return fmt.Errorf("object %s: %w", name, err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return fmt.Errorf("object %s: %w", name, err)
		}
	} else if err != nil {
		return fmt.Errorf("object %s: %w", name, err)
	}
	if err := s.syncParents(parent); err != nil {
		return fmt.Errorf("object %s: written but maybe not durable: %w", name, err)
	}
	return nil
}

// copyExactly copies size bytes from r to w, checking ctx every copyChunk
// bytes, and fails unless r ends exactly there: a reader that disagrees
// with its declared size means the caller is confused about what it stores.
func copyExactly(ctx context.Context, w io.Writer, r io.Reader, size int64) error {
	for done := int64(0); done < size; {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := io.CopyN(w, r, min(copyChunk, size-done))
		done += n
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("reader ended after %d of %d bytes: %w", done, size, errdefs.ErrInvalid)
		}
		if err != nil {
			return err
		}
	}
	var extra [1]byte
	n, err := io.ReadFull(r, extra[:])
	if n > 0 {
		return fmt.Errorf("reader has more than the declared %d bytes: %w", size, errdefs.ErrInvalid)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// syncParents makes the rename into parent durable, and the entries of any
// directories between parent and the store root not yet known to be.
func (s *localStore) syncParents(parent string) error {
	if err := fsat.SyncDir(parent); err != nil {
		return err
	}
	for d := parent; d != s.dir && d != filepath.Dir(d); d = filepath.Dir(d) {
		s.mu.Lock()
		known := s.durable[d]
		s.mu.Unlock()
		if known {
			return nil
		}
		if err := fsat.SyncDir(filepath.Dir(d)); err != nil {
			return err
		}
		s.mu.Lock()
		s.durable[d] = true
		s.mu.Unlock()
	}
	return nil
}
