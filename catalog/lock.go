package catalog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// lockFileName is turnsnap's own lock inside the catalog directory. Badger
// flocks the directory itself, but it reports a held lock only as formatted
// text (its y.Wrapf drops the errno), so we could tell "in use" from other
// failures only by matching its message. Taking our own flock first gives a
// real EWOULDBLOCK to test for. It must be a separate file: flocking the
// directory here would make Badger's own flock of it fail.
const lockFileName = "turnsnap.lock"

// dirLock is an exclusive flock held for the life of an open Catalog. flock
// locks belong to the open file description, so a second Open in the same
// process conflicts just as another process does, and the kernel drops the
// lock when the process dies, so a crash never leaves a stale lock behind.
type dirLock struct{ f *os.File }

func lockDir(dir string, readOnly bool) (*dirLock, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFileName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil && readOnly {
		// A read-only filesystem: flock works on a descriptor opened for
		// reading, and an absent lock file means no writer can be there.
		if f, err = os.Open(filepath.Join(dir, lockFileName)); errors.Is(err, os.ErrNotExist) {
			return &dirLock{}, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("catalog %s: lock: %w", dir, err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, inUse(dir, nil)
		}
		return nil, fmt.Errorf("catalog %s: lock: %w", dir, err)
	}
	return &dirLock{f: f}, nil
}

func (l *dirLock) unlock() error {
	if l.f == nil {
		return nil
	}
	// Closing the only descriptor releases the flock. The file stays: removing
	// it would race with another process that has opened but not yet locked it.
	return l.f.Close()
}

// inUse is the error for a catalog directory locked by someone else; detail,
// if any, is the lower-level error that showed it.
func inUse(dir string, detail error) error {
	if detail != nil {
		return fmt.Errorf("catalog %s is in use by another turnsnap process (%v): %w", dir, detail, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("catalog %s is in use by another turnsnap process: %w", dir, errdefs.ErrUnavailable)
}

// isBadgerLockErr recognises Badger's own directory-lock failure, which we can
// still meet when something other than turnsnap (the badger CLI, say) holds
// the directory. Only its message identifies it; see lockFileName.
func isBadgerLockErr(err error) bool {
	return strings.Contains(err.Error(), "Cannot acquire directory lock")
}
