package fstree

import (
	"context"
	"errors"
	"github.com/turnsnap/turnsnap/delta"

	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// Unchanged reports whether directory root still holds exactly what the
// scan that made c saw: every directory lists the same names, and every
// entry stats to the key c recorded for it. Then a Scan of root with c as
// Prev would read no file and build every entry, and so every tree, as
// that scan did (below), so its result is that scan's: a caller that
// checked that result (a materialised base hashed to its tree) need not
// hash again. It costs a listing per directory and a stat per entry, as a
// Scan with a cache does, but builds, encodes and hashes no tree and
// makes no new cache; for a 20,000-file base that is most of the check.
//
// Why equal keys give equal entries: an entry's key holds its inode, size,
// mode, mtime and ctime. Everything else a Scan records of it moves its
// ctime when it changes (owner, xattrs, link count, content), or needs a
// new inode (a symlink's target, a device number), and a file's size,
// chunks, holes and xattrs are what c recorded for that key, which is what
// a Scan takes from a cache hit. A racy entry (stamped too close to its
// scan to trust its ctime) and a later name of a hardlinked file (which
// the cache does not hold: its role comes from the walk order) answer
// false, and so does any error: the caller scans.
func (c *ScanCache) Unchanged(ctx context.Context, root string) bool {
	if c == nil {
		return false
	}
	fd, err := fsat.OpenDir(root)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	u := &unchanged{c: c, rel: make([]byte, 0, 256), buf: make([]byte, fsat.DirBufSize)}
	return u.dir(ctx, fd, 0) && u.seen == c.Len()
}

// errStop ends a listing early.
var errStop = errors.New("stop listing")

type unchanged struct {
	c    *ScanCache
	rel  []byte // the path being looked at
	buf  []byte // the getdents buffer: a listing ends before its subdirectories'
	seen int
}

func (u *unchanged) dir(ctx context.Context, fd, depth int) bool {
	if ctx.Err() != nil || depth > delta.MaxDepth {
		return false
	}
	var subdirs []string
	base := len(u.rel)
	ok := true
	err := fsat.EachDirName(fd, u.buf, func(name []byte) error {
		u.rel = u.rel[:base]
		if base > 0 {
			u.rel = append(u.rel, '/')
		}
		u.rel = append(u.rel, name...)
		e, hit := u.c.Get(string(u.rel))
		var st unix.Stat_t
		if !hit || e.Racy || unix.Fstatat(fd, string(name), &st, unix.AT_SYMLINK_NOFOLLOW) != nil || cacheKeyOf(&st) != e.Key {
			ok = false
			return errStop
		}
		u.seen++
		if e.Entry.Type == delta.TypeDir {
			subdirs = append(subdirs, string(name))
		}
		return nil
	})
	u.rel = u.rel[:base]
	if err != nil || !ok {
		return false
	}
	for _, name := range subdirs {
		if !u.sub(ctx, fd, name, depth) {
			return false
		}
	}
	return true
}

// sub looks into subdirectory name of fd, checked to be the inode stat-ed.
func (u *unchanged) sub(ctx context.Context, fd int, name string, depth int) bool {
	base := len(u.rel)
	if base > 0 {
		u.rel = append(u.rel, '/')
	}
	u.rel = append(u.rel, name...)
	defer func() { u.rel = u.rel[:base] }()
	e, _ := u.c.Get(string(u.rel))
	sfd, err := fsat.Open(fd, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return false
	}
	defer unix.Close(sfd)
	var st unix.Stat_t
	if unix.Fstat(sfd, &st) != nil || cacheKeyOf(&st) != e.Key {
		return false
	}
	return u.dir(ctx, sfd, depth+1)
}
