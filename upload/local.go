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
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

const (
	// tmpDir holds Puts in progress. It lives inside the store directory so
	// that rename into place never crosses a filesystem. Object names whose
	// first component is tmpDir are refused: they would land among the
	// temporary files and be cleaned away.
	tmpDir = ".tmp"
	// copyChunk is how much Put copies between checks of its context, so a
	// cancelled checkpoint stops within a millisecond or so of disk time
	// rather than after a multi-GiB object.
	copyChunk = 1 << 20
	// staleTemp is how old a temporary file must be before NewLocal deletes
	// it. A live Put keeps writing, so its file's mtime stays fresh; an hour
	// leaves a wide margin for another process sharing the directory whose
	// Put is stalled, while still reclaiming the space a crash left behind.
	staleTemp = time.Hour
)

// localStore keeps each object in a file at dir/<name>.
type localStore struct {
	dir string

	// durable records directories whose own entry in their parent is known
	// to have been fsynced, so Put syncs the whole chain of parents only the
	// first time it uses a directory. Checking what exists instead would race
	// with a concurrent Put that has created a directory but not synced it.
	mu      sync.Mutex
	durable map[string]bool
}

// NewLocal returns a Store that keeps objects as files under dir, creating
// dir if needed. The store also implements RangeGetter.
//
// Directories are created 0700 and files 0600: checkpoints hold whatever
// the sandbox held, secrets included.
//
// NewLocal deletes temporary files older than an hour from dir/.tmp. They
// are what a Put left behind when its process died between creating the
// temporary file and renaming it into place; nothing else will ever remove
// them, and no reader can see them.
func NewLocal(dir string) (Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("local store %s: %w", dir, err)
	}
	_, statErr := os.Stat(abs)
	if err := os.MkdirAll(filepath.Join(abs, tmpDir), 0o700); err != nil {
		return nil, fmt.Errorf("local store %s: %w", abs, err)
	}
	// Make the store directory's existence durable here, if it is new, so
	// that Put never syncs above it.
	syncs := []string{abs}
	if statErr != nil {
		syncs = append(syncs, filepath.Dir(abs))
	}
	for _, d := range syncs {
		if err := fsat.SyncDir(d); err != nil {
			return nil, fmt.Errorf("local store %s: %w", abs, err)
		}
	}
	s := &localStore{dir: abs, durable: map[string]bool{}}
	if err := s.cleanTemp(time.Now().Add(-staleTemp)); err != nil {
		return nil, fmt.Errorf("local store %s: %w", abs, err)
	}
	return s, nil
}

func (s *localStore) cleanTemp(cutoff time.Time) error {
	tmp := filepath.Join(s.dir, tmpDir)
	ents, err := os.ReadDir(tmp)
	if err != nil {
		return err
	}
	for _, e := range ents {
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if info.ModTime().Before(cutoff) {
			if err := os.RemoveAll(filepath.Join(tmp, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// check validates name for this store.
func (s *localStore) check(name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	if name == tmpDir || strings.HasPrefix(name, tmpDir+"/") {
		return fmt.Errorf("object %q: %s is reserved by the local store: %w", name, tmpDir, errdefs.ErrInvalid)
	}
	return nil
}

func (s *localStore) path(name string) string {
	return filepath.Join(s.dir, filepath.FromSlash(name))
}

// objectErr turns a filesystem error about name into the store's terms:
// a missing file, or a file where a directory should be, is ErrNotFound.
func objectErr(name string, err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("object %s: %w", name, errdefs.ErrNotFound)
	}
	return fmt.Errorf("object %s: %w", name, err)
}

// open opens name for reading; directories are not objects.
func (s *localStore) open(ctx context.Context, name string) (*os.File, fs.FileInfo, error) {
	if err := s.check(name); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("object %s: %w", name, err)
	}
	f, err := os.Open(s.path(name))
	if err != nil {
		return nil, nil, objectErr(name, err)
	}
	info, err := f.Stat()
	if err == nil && !info.Mode().IsRegular() {
		err = fs.ErrNotExist
	}
	if err != nil {
		f.Close()
		return nil, nil, objectErr(name, err)
	}
	return f, info, nil
}

func (s *localStore) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	f, _, err := s.open(ctx, name)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// GetRange reads length bytes at offset, or fewer if the object ends first.
func (s *localStore) GetRange(ctx context.Context, name string, offset, length int64) (io.ReadCloser, error) {
	if offset < 0 || length < 0 {
		return nil, fmt.Errorf("object %s: bad range %d+%d: %w", name, offset, length, errdefs.ErrInvalid)
	}
	f, _, err := s.open(ctx, name)
	if err != nil {
		return nil, err
	}
	return readCloser{io.NewSectionReader(f, offset, length), f}, nil
}

func (s *localStore) Stat(ctx context.Context, name string) (ObjectInfo, error) {
	if err := s.check(name); err != nil {
		return ObjectInfo{}, err
	}
	if err := ctx.Err(); err != nil {
		return ObjectInfo{}, fmt.Errorf("object %s: %w", name, err)
	}
	info, err := os.Stat(s.path(name))
	if err == nil && !info.Mode().IsRegular() {
		err = fs.ErrNotExist
	}
	if err != nil {
		return ObjectInfo{}, objectErr(name, err)
	}
	return ObjectInfo{Name: name, Size: info.Size(), ModTime: info.ModTime()}, nil
}

// Delete removes name and syncs its directory, so that a deleted mutable
// object such as a ref does not come back after a crash.
func (s *localStore) Delete(ctx context.Context, name string) error {
	if err := s.check(name); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("object %s: %w", name, err)
	}
	path := s.path(name)
	info, err := os.Lstat(path)
	if err == nil && info.IsDir() {
		return nil // a directory is no object, so there is nothing to delete
	}
	if err == nil {
		err = os.Remove(path)
	}
	if err != nil {
		if errors.Is(objectErr(name, err), errdefs.ErrNotFound) {
			return nil
		}
		return fmt.Errorf("object %s: %w", name, err)
	}
	if err := fsat.SyncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("object %s: deleted but maybe not durably: %w", name, err)
	}
	return nil
}
