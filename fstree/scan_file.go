package fstree

import (
	"context"
	"errors"
	"fmt"
	"github.com/turnsnap/turnsnap/delta"
	"os"

	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// file reads, chunks and saves a regular file's content. It returns the
// file's identity as of the read: stat of the open descriptor, checked again
// after the read so a file changed mid-read is never cached as consistent.
func (s *scanner) file(ctx context.Context, dirFD int, rel string, st *unix.Stat_t, e *delta.Entry) (CacheKey, error) {
	for attempt := 0; ; attempt++ {
		key, changed, err := s.readFile(ctx, dirFD, rel, st, e)
		if err != nil || !changed {
			return key, err
		}
		if attempt == 3 {
			return key, fmt.Errorf("scan %s: file kept changing while it was read", s.where(rel))
		}
	}
}

func (s *scanner) readFile(ctx context.Context, dirFD int, rel string, st *unix.Stat_t, e *delta.Entry) (CacheKey, bool, error) {
	// O_NONBLOCK: if the name became a fifo since the stat, opening it
	// must not wait for a writer.
	fd, err := unix.Openat(dirFD, e.Name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NOATIME|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EPERM) {
		fd, err = unix.Openat(dirFD, e.Name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return CacheKey{}, false, s.raced(rel, err)
	}
	f := os.NewFile(uintptr(fd), e.Name)
	defer f.Close()
	var before, after unix.Stat_t
	if err := unix.Fstat(fd, &before); err != nil {
		return CacheKey{}, false, fmt.Errorf("scan %s: %w", s.where(rel), err)
	}
	if before.Mode&unix.S_IFMT != unix.S_IFREG || !fsat.SameFile(&before, st) {
		return CacheKey{}, false, errRaced
	}
	c, err := s.files.Read(ctx, f, &before)
	if err != nil {
		return CacheKey{}, false, fmt.Errorf("scan %s: %w", s.where(rel), err)
	}
	e.SetContent(c)
	if err := unix.Fstat(fd, &after); err != nil {
		return CacheKey{}, false, fmt.Errorf("scan %s: %w", s.where(rel), err)
	}
	k := cacheKeyOf(&after)
	return k, k != cacheKeyOf(&before) || uint64(after.Size) != e.Size, nil
}
