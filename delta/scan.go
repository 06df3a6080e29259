package delta

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ScanOptions configures Scan.
type ScanOptions struct {
	// Saver receives every new chunk and tree. Nil hashes without storing,
	// which is how a restore re-derives the tree it has just written.
	Saver BlobSaver
	// Prev is the cache of the last committed scan of the same directory.
	// Files whose inode, size, mtime, ctime and mode all match are not read.
	Prev *ScanCache
	// Translate lets a backend reinterpret an entry before it enters the tree
	// (overlay: a 0:0 character device is a whiteout, trusted.overlay.opaque
	// marks an opaque directory). rel is root-relative. Return false to leave
	// the entry out. Entries taken from Prev arrive already translated, so
	// Translate must be idempotent.
	Translate func(rel string, st *unix.Stat_t, e *Entry) (keep bool, err error)
	// Residue reports directories that carry no state of their own: an overlay
	// copy-up left behind by a change that was later undone. They stay in the
	// tree but are left out of the state key, so such a turn classifies as skip.
	Residue func(rel string, e *Entry) bool
	// Quiescent says nothing else writes below root during the scan (a layer
	// just restored and not yet mounted), so entries stamped moments ago can be
	// trusted next time instead of being treated as racy.
	Quiescent bool
}

// ScanStats counts a scan's work; FilesRead is how tests prove that unchanged
// files are not read again.
type ScanStats struct {
	Entries   int64
	Dirs      int64
	FilesRead int64
	BytesRead int64
	Chunks    int64
	// CacheHits counts files whose entry was taken from Prev unread.
	CacheHits int64
}

// ScanResult is a scanned state.
type ScanResult struct {
	Root ID // tree of the directory's contents
	// StateKey hashes the recovery-relevant state only: the tree without
	// directory mtimes and without residue directories. Two scans with equal
	// StateKeys are the same state for classification (a turn that created and
	// deleted a temp file changes a directory mtime and nothing else).
	StateKey ID
	Cache    *ScanCache
	Stats    ScanStats
}

// racyWindow covers the coarse clock that stamps ctime: a file changed in the
// same clock tick as the scan that cached it could keep its ctime, so entries
// that new are re-read next time (git's "racily clean" rule).
const racyWindow = 50 * time.Millisecond

// xattrBufSize bounds one xattr list or value read; the kernel's own limit is 64 KiB.
const xattrBufSize = 64 << 10

type scanner struct {
	opts      ScanOptions
	root      string
	next      *ScanCache
	stats     ScanStats
	links     map[[2]uint64]string // (dev, inode) -> root-relative path of its first name
	chunker   *Chunker
	xbuf      []byte
	racyAfter int64
}

// Scan walks the directory root and returns the tree of its contents. The
// walk is depth-first in byte order of names, the canonical order of
// docs/FORMAT.md: the first name of a hardlinked file in that order holds
// its content, later names are TypeHardlink entries pointing at it.
// Scan never follows symlinks. The root's own metadata is not captured.
func Scan(ctx context.Context, root string, opts ScanOptions) (*ScanResult, error) {
	s := &scanner{
		opts:      opts,
		root:      root,
		next:      &ScanCache{Version: cacheVersion, Entries: map[string]CacheEntry{}},
		links:     map[[2]uint64]string{},
		xbuf:      make([]byte, xattrBufSize),
		chunker:   NewChunker(),
		racyAfter: time.Now().Add(-racyWindow).UnixNano(),
	}
	if opts.Quiescent {
		s.racyAfter = math.MaxInt64
	}
	id, key, err := s.dir(ctx, "")
	if err != nil {
		return nil, err
	}
	return &ScanResult{Root: id, StateKey: key, Cache: s.next, Stats: s.stats}, nil
}

func (s *scanner) abs(rel string) string {
	if rel == "" {
		return s.root
	}
	return filepath.Join(s.root, rel)
}

// dir builds and saves the tree of directory rel; it returns the tree's ID
// and its state key.
func (s *scanner) dir(ctx context.Context, rel string) (ID, ID, error) {
	if err := ctx.Err(); err != nil {
		return ID{}, ID{}, err
	}
	s.stats.Dirs++
	names, err := readNames(s.abs(rel))
	if err != nil {
		return ID{}, ID{}, err
	}
	slices.Sort(names)
	t := &Tree{Entries: make([]Entry, 0, len(names))}
	st := &Tree{Entries: make([]Entry, 0, len(names))}
	for _, name := range names {
		crel := path.Join(rel, name)
		e, key, keep, err := s.entry(ctx, crel, name)
		if err != nil {
			return ID{}, ID{}, err
		}
		if !keep {
			continue
		}
		t.Entries = append(t.Entries, e)
		if e.Type == TypeDir {
			// The cheap test first: Residue looks at the lower layer on disk.
			if key == emptyTreeID && s.opts.Residue != nil && s.opts.Residue(crel, &e) {
				continue
			}
			e.MtimeNs = 0
			e.Subtree = key
		}
		st.Entries = append(st.Entries, e)
	}
	if err := t.Check(); err != nil {
		return ID{}, ID{}, fmt.Errorf("scan %s: %w", s.abs(rel), err)
	}
	data := t.Encode()
	id := Hash(data)
	if s.opts.Saver != nil {
		if _, err := s.opts.Saver.SaveBlob(ctx, BlobTree, id, data); err != nil {
			return ID{}, ID{}, fmt.Errorf("save tree of %s: %w", s.abs(rel), err)
		}
	}
	return id, Hash(st.Encode()), nil
}

var emptyTreeID = Hash((&Tree{}).Encode())

// EmptyTree returns the ID of the tree with no entries.
func EmptyTree() ID { return emptyTreeID }

func (s *scanner) entry(ctx context.Context, rel, name string) (Entry, ID, bool, error) {
	p := s.abs(rel)
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return Entry{}, ID{}, false, nil // deleted while we walked: not part of this state
		}
		return Entry{}, ID{}, false, fmt.Errorf("scan %s: %w", p, err)
	}
	s.stats.Entries++
	fresh := cacheKeyOf(&st)
	e := Entry{
		Name: name, Mode: st.Mode & modeMask, UID: st.Uid, GID: st.Gid,
		MtimeNs: unix.TimespecToNsec(st.Mtim),
	}
	prev, hit := s.opts.Prev.lookup(rel, fresh)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Type = TypeFile
	case unix.S_IFDIR:
		e.Type = TypeDir
	case unix.S_IFLNK:
		e.Type = TypeSymlink
	case unix.S_IFCHR:
		e.Type, e.Rdev = TypeCharDev, st.Rdev
	case unix.S_IFBLK:
		e.Type, e.Rdev = TypeBlockDev, st.Rdev
	case unix.S_IFIFO:
		e.Type = TypeFIFO
	case unix.S_IFSOCK:
		e.Type = TypeSocket
	default:
		return Entry{}, ID{}, false, fmt.Errorf("scan %s: unknown file type %#o", p, st.Mode&unix.S_IFMT)
	}
	// Only regular files are hardlinks in the format. Other multiply-linked
	// inodes are recorded name by name: overlayfs (since Linux 5.8) links
	// every whiteout to one shared 0:0 device, and each of those names is a
	// whiteout of its own.
	if e.Type == TypeFile && st.Nlink > 1 {
		ino := [2]uint64{st.Dev, st.Ino}
		if primary, ok := s.links[ino]; ok {
			link := Entry{Name: name, Type: TypeHardlink, Target: primary}
			return link, ID{}, true, nil
		}
		s.links[ino] = rel
	}
	var err error
	if hit {
		// The cached entry is already translated, so Translate must be
		// idempotent: it sees the opaque flag here, not the raw xattr.
		e.Xattrs, e.Opaque = prev.Entry.Xattrs, prev.Entry.Opaque
	} else if e.Xattrs, err = s.xattrs(p); err != nil {
		return Entry{}, ID{}, false, err
	}
	switch e.Type {
	case TypeSymlink:
		if e.Target, err = os.Readlink(p); err != nil {
			return Entry{}, ID{}, false, fmt.Errorf("scan %s: %w", p, err)
		}
	case TypeFile:
		if hit {
			e.Size, e.Chunks = prev.Entry.Size, prev.Entry.Chunks
			s.stats.CacheHits++
		} else if fresh, err = s.file(ctx, p, &e); err != nil {
			return Entry{}, ID{}, false, err
		}
	}
	if s.opts.Translate != nil {
		keep, err := s.opts.Translate(rel, &st, &e)
		if err != nil || !keep {
			return Entry{}, ID{}, keep, err
		}
	}
	var key ID
	if e.Type == TypeDir {
		if e.Subtree, key, err = s.dir(ctx, rel); err != nil {
			return Entry{}, ID{}, false, err
		}
	}
	ce := CacheEntry{Key: fresh, Entry: e, Racy: fresh.CtimeNs >= s.racyAfter}
	ce.Entry.Name = ""
	s.next.Entries[rel] = ce
	return e, key, true, nil
}

// file reads, chunks and saves a regular file's content. It returns the
// file's identity as of the read: stat of the open descriptor, checked again
// after the read so a file changed mid-read is never cached as consistent.
func (s *scanner) file(ctx context.Context, p string, e *Entry) (CacheKey, error) {
	for attempt := 0; ; attempt++ {
		key, changed, err := s.readFile(ctx, p, e)
		if err != nil || !changed {
			return key, err
		}
		if attempt == 3 {
			return key, fmt.Errorf("scan %s: file kept changing while it was read", p)
		}
	}
}

func (s *scanner) readFile(ctx context.Context, p string, e *Entry) (CacheKey, bool, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NOATIME, 0)
	if err != nil {
		return CacheKey{}, false, fmt.Errorf("scan %s: %w", p, err)
	}
	defer f.Close()
	var before, after unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &before); err != nil {
		return CacheKey{}, false, fmt.Errorf("scan %s: %w", p, err)
	}
	s.stats.FilesRead++
	e.Chunks, e.Size = e.Chunks[:0], 0
	err = s.chunker.Chunk(f, before.Size, func(data []byte) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		id := Hash(data)
		if s.opts.Saver != nil {
			if _, err := s.opts.Saver.SaveBlob(ctx, BlobData, id, data); err != nil {
				return err
			}
		}
		e.Chunks = append(e.Chunks, id)
		e.Size += uint64(len(data))
		s.stats.Chunks++
		return nil
	})
	s.stats.BytesRead += int64(e.Size)
	if err != nil {
		return CacheKey{}, false, fmt.Errorf("scan %s: %w", p, err)
	}
	if len(e.Chunks) == 0 {
		e.Chunks = nil
	}
	if err := unix.Fstat(int(f.Fd()), &after); err != nil {
		return CacheKey{}, false, fmt.Errorf("scan %s: %w", p, err)
	}
	k := cacheKeyOf(&after)
	return k, k != cacheKeyOf(&before) || uint64(after.Size) != e.Size, nil
}

// readNames lists a directory without stat-ing its entries.
func readNames(p string) ([]string, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", p, err)
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("scan %s: %w", p, err)
	}
	return names, nil
}

// xattrs returns all extended attributes of p, sorted by name.
func (s *scanner) xattrs(p string) ([]Xattr, error) {
	x, err := readXattrs(p, s.xbuf)
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", p, err)
	}
	return x, nil
}

// ReadXattrs returns all extended attributes of p (not following a
// symlink), sorted by name, as a scan would record them.
func ReadXattrs(p string) ([]Xattr, error) {
	return readXattrs(p, make([]byte, xattrBufSize))
}

func readXattrs(p string, listBuf []byte) ([]Xattr, error) {
	n, err := unix.Llistxattr(p, listBuf)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, fmt.Errorf("list xattrs: %w", err)
	}
	var out []Xattr
	for _, name := range strings.Split(string(listBuf[:n]), "\x00") {
		if name == "" {
			continue
		}
		vbuf := make([]byte, xattrBufSize)
		vn, err := unix.Lgetxattr(p, name, vbuf)
		if errors.Is(err, unix.ENODATA) {
			continue // removed between list and get
		}
		if err != nil {
			return nil, fmt.Errorf("xattr %s: %w", name, err)
		}
		out = append(out, Xattr{Name: name, Value: slices.Clone(vbuf[:vn])})
	}
	slices.SortFunc(out, func(a, b Xattr) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
