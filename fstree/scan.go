// Package fstree holds the filesystem algorithms on real directory trees,
// in package delta's format: the scan of a directory into trees and chunks
// (Scan, ScanChanged, the ScanCache that lets a scan skip unchanged files),
// the safe materialisation of a tree into a directory (Materialise,
// ApplyLayer, and EntryWriter for fstree/pathrestore), and the in-place
// diff apply a rollback uses (PlanDiff, DiffPlan). Every walk goes through descriptors and never
// follows a symlink (internal/fsat).
package fstree

import (
	"context"
	"errors"
	"fmt"
	"github.com/turnsnap/turnsnap/delta"
	"math"
	"path"
	"slices"
	"time"

	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// ScanOptions configures Scan.
type ScanOptions struct {
	// Saver receives every new chunk and tree. Nil hashes without storing,
	// which is how a restore re-derives the tree it has just written.
	Saver delta.BlobSaver
	// IDs is the home's content ID scheme (zero: plain BLAKE3).
	IDs delta.IDs
	// Prev is the cache of the last committed scan of the same directory.
	// Files whose inode, size, mtime, ctime and mode all match are not read.
	Prev *ScanCache
	// Translate lets a backend reinterpret an entry before it enters the tree
	// (overlay: a 0:0 character device is a whiteout, trusted.overlay.opaque
	// marks an opaque directory). rel is root-relative. Return false to leave
	// the entry out. Entries taken from Prev arrive already translated, so
	// Translate must be idempotent.
	Translate func(rel string, st *unix.Stat_t, e *delta.Entry) (keep bool, err error)
	// Residue reports directories that carry no state of their own: an overlay
	// copy-up left behind by a change that was later undone. They stay in the
	// tree but are left out of the state key, so such a turn classifies as skip.
	Residue func(rel string, e *delta.Entry) bool
	// Redirect lets a backend list a directory from somewhere else: overlay
	// lists a renamed base directory (trusted.overlay.redirect), whose upper
	// holds only what changed, through the mount, so its merged contents are
	// recorded (as an opaque directory: Redirect sets e.Opaque). dirFD and
	// name locate the directory's entry. It returns an open directory
	// descriptor, which the scan closes, or -1 to list the directory itself.
	// Entries below a redirected directory are already merged: they are not
	// passed to Translate, Residue or Redirect.
	Redirect func(dirFD int, name, rel string, e *delta.Entry) (int, error)
	// LinkID, when set, gives the identity by which a multiply-linked file
	// outside redirected directories is matched to its other names (default:
	// its device and inode). Overlay sets it when a redirect was listed, so
	// that files of the upper and files seen through the mount compare by
	// the mount's inode numbers.
	LinkID func(dirFD int, name, rel string, st *unix.Stat_t) ([2]uint64, error)
	// Workers bounds the goroutines that hash and compress a large scan's
	// chunks (FileReader): 0 is GOMAXPROCS, 1 reads, hashes and saves on
	// the calling goroutine only. The result is the same either way.
	Workers int
	// Quiescent says nothing else writes below root during the scan (a layer
	// just restored and not yet mounted), so entries stamped moments ago can be
	// trusted next time instead of being treated as racy.
	Quiescent bool
	// TreeLinks, for a tracked scan, says how many of a multiply-linked
	// file's links are names below root (overlay: all but its index entry);
	// nil counts st.Nlink. A tracked scan walks for a file with two or more.
	TreeLinks func(dirFD int, name, rel string, st *unix.Stat_t) (uint64, error)
	// Reread names root-relative paths whose cache entries are not to be
	// trusted even if their stat matches: files a process maps shared and
	// writable, whose stores need not move mtime or ctime (a store to an
	// already dirty page faults no more, so nothing stamps the file).
	Reread map[string]bool
	// Changed, when set, makes this a tracked scan (scan_changed.go): a
	// directory that no changed path lies in or below and whose stat
	// matches Prev is taken from Prev without being listed.
	Changed *ChangeSet

	// beforeOpen, for tests, runs between the stat of an entry and the
	// open of it: the window a racing writer swaps a name in.
	beforeOpen func(rel string)
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
	Root delta.ID // tree of the directory's contents
	// StateKey hashes the recovery-relevant state only: the tree without
	// directory mtimes and without residue directories. Two scans with equal
	// StateKeys are the same state for classification (a turn that created and
	// deleted a temp file changes a directory mtime and nothing else).
	StateKey delta.ID
	Cache    *ScanCache
	Stats    ScanStats
}

// RacyWindow covers the coarse clock that stamps ctime: a file changed in the
// same clock tick as the scan that cached it could keep its ctime, so entries
// that new are re-read next time (git's "racily clean" rule).
const RacyWindow = 50 * time.Millisecond

// xattrBufSize bounds one xattr list or value read; the kernel's own limit is 64 KiB.
const xattrBufSize = fsat.XattrBufSize

// raceRetries bounds how often one entry is looked at again after it
// changed kind or identity between its stat and its open.
const raceRetries = 8

type scanner struct {
	opts      ScanOptions
	root      string
	next      *ScanCache
	stats     ScanStats
	links     map[[2]uint64]string // (dev, inode) -> root-relative path of its first name
	files     *FileReader
	xbuf      []byte
	racyAfter int64
	empty     delta.ID // the empty tree's ID under opts.IDs
	// shallow stops entry at a directory's own entry (a diff's verify
	// checks the children it wrote one by one).
	shallow bool
}

// errRaced reports an entry that changed between its stat and its open.
var errRaced = errors.New("entry changed while it was scanned")

// Scan walks the directory root and returns the tree of its contents. The
// walk is depth-first in byte order of names, the canonical order of
// docs/FORMAT.md: the first name of a hardlinked file in that order holds
// its content, later names are TypeHardlink entries pointing at it.
//
// Scan never follows a symlink and never builds a path below root: every
// directory is opened from its parent's descriptor (openat2
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, O_NOFOLLOW), so a writer that swaps
// a directory for a symlink mid-scan gets the symlink recorded, never what
// it points to, and paths of any length inside root work. The root's own
// metadata is not captured.
func Scan(ctx context.Context, root string, opts ScanOptions) (*ScanResult, error) {
	fd, err := fsat.OpenDir(root)
	if err != nil {
		return nil, fmt.Errorf("scan: %w", err)
	}
	defer unix.Close(fd)
	s := &scanner{
		opts:      opts,
		root:      root,
		next:      NewScanCache(),
		links:     map[[2]uint64]string{},
		xbuf:      make([]byte, xattrBufSize),
		racyAfter: time.Now().Add(-RacyWindow).UnixNano(),
		empty:     opts.IDs.EmptyTree(),
	}
	s.files = NewFileReader(opts.IDs, opts.Saver, &s.stats, opts.Workers)
	if opts.Quiescent {
		s.racyAfter = math.MaxInt64
	}
	id, key, err := s.dir(ctx, fd, "", dirFlags{})
	if cerr := s.files.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("scan %s: %w", root, cerr)
	}
	if err != nil {
		return nil, err
	}
	if opts.Changed != nil {
		return &ScanResult{Root: id, StateKey: key, Cache: opts.Prev.merge(s.next), Stats: s.stats}, nil
	}
	s.next.indexLinks()
	return &ScanResult{Root: id, StateKey: key, Cache: s.next, Stats: s.stats}, nil
}

// where names rel for errors: the root, then the in-sandbox path.
func (s *scanner) where(rel string) string { return s.root + ":/" + rel }

// dirFlags says how a directory's entries are interpreted.
type dirFlags struct {
	merged bool // listed through a merged view: no backend translation
	opaque bool // below an opaque directory: nothing of the lower shows, so no residue
}

// dir builds and saves the tree of directory rel, open as fd. It returns
// the tree's ID and its state key.
func (s *scanner) dir(ctx context.Context, fd int, rel string, fl dirFlags) (delta.ID, delta.ID, error) {
	if err := ctx.Err(); err != nil {
		return delta.ID{}, delta.ID{}, err
	}
	s.stats.Dirs++
	names, err := fsat.ReadDirNames(fd)
	if err != nil {
		return delta.ID{}, delta.ID{}, fmt.Errorf("scan %s: %w", s.where(rel), err)
	}
	slices.Sort(names)
	t := &delta.Tree{Entries: make([]delta.Entry, 0, len(names))}
	st := &delta.Tree{Entries: make([]delta.Entry, 0, len(names))}
	subdirs := false // st differs from t only in subdirectory entries
	var lists []delta.ChunkListBlob
	for _, name := range names {
		crel := path.Join(rel, name)
		var e delta.Entry
		var key delta.ID
		var keep bool
		for attempt := 0; ; attempt++ {
			e, key, keep, err = s.entry(ctx, fd, crel, name, fl)
			if !errors.Is(err, errRaced) {
				break
			}
			if attempt == raceRetries {
				return delta.ID{}, delta.ID{}, fmt.Errorf("scan %s: kept changing while it was scanned", s.where(crel))
			}
		}
		if err != nil {
			return delta.ID{}, delta.ID{}, err
		}
		if !keep {
			continue
		}
		// Before both trees take the entry: the state tree's canonical
		// encoding names the same chunk list.
		if l, ok := e.MakeIndirect(s.opts.IDs); ok {
			lists = append(lists, l)
		}
		t.Entries = append(t.Entries, e)
		if e.Type == delta.TypeDir {
			subdirs = true
			// The cheap test first: Residue looks at the lower layer on disk.
			if !fl.merged && !fl.opaque && key == s.empty && s.opts.Residue != nil && s.opts.Residue(crel, &e) {
				continue
			}
			e.MtimeNs = 0
			e.Subtree = key
		}
		st.Entries = append(st.Entries, e)
	}
	if err := t.Check(); err != nil {
		return delta.ID{}, delta.ID{}, fmt.Errorf("scan %s: %w", s.where(rel), err)
	}
	for _, l := range lists {
		if err := s.files.Save(ctx, delta.BlobTree, l.ID, l.Data); err != nil {
			return delta.ID{}, delta.ID{}, fmt.Errorf("save chunk list of %s: %w", s.where(rel), err)
		}
	}
	data := t.Encode()
	id := s.opts.IDs.Hash(data)
	if err := s.files.Save(ctx, delta.BlobTree, id, data); err != nil {
		return delta.ID{}, delta.ID{}, fmt.Errorf("save tree of %s: %w", s.where(rel), err)
	}
	if !subdirs {
		return id, id, nil // the same entries, the same encoding
	}
	return id, s.opts.IDs.Hash(st.Encode()), nil
}

// entry looks at name in the directory open as dirFD. errRaced means the
// name changed under it and is to be looked at again.
func (s *scanner) entry(ctx context.Context, dirFD int, rel, name string, fl dirFlags) (delta.Entry, delta.ID, bool, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirFD, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return delta.Entry{}, delta.ID{}, false, nil // deleted while we walked: not part of this state
		}
		return delta.Entry{}, delta.ID{}, false, fmt.Errorf("scan %s: %w", s.where(rel), err)
	}
	s.stats.Entries++
	fresh := cacheKeyOf(&st)
	e := delta.Entry{
		Name: name, Mode: st.Mode & delta.ModeMask, UID: st.Uid, GID: st.Gid,
		MtimeNs: unix.TimespecToNsec(st.Mtim),
	}
	prev, hit := s.opts.Prev.lookup(rel, fresh)
	if s.opts.Reread[rel] {
		prev, hit = CacheEntry{}, false
	}
	if s.opts.Changed != nil {
		if !s.opts.Reread[rel] {
			prev, hit = s.lookupTracked(rel, fresh, prev, hit)
		}
		if e, key, ok, err := s.reuse(dirFD, rel, name, &st, prev, hit, fl); ok || err != nil {
			return e, key, ok, err
		}
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Type = delta.TypeFile
	case unix.S_IFDIR:
		e.Type = delta.TypeDir
	case unix.S_IFLNK:
		e.Type = delta.TypeSymlink
	case unix.S_IFCHR:
		e.Type, e.Rdev = delta.TypeCharDev, st.Rdev
	case unix.S_IFBLK:
		e.Type, e.Rdev = delta.TypeBlockDev, st.Rdev
	case unix.S_IFIFO:
		e.Type = delta.TypeFIFO
	case unix.S_IFSOCK:
		e.Type = delta.TypeSocket
	default:
		return delta.Entry{}, delta.ID{}, false, fmt.Errorf("scan %s: unknown file type %#o", s.where(rel), st.Mode&unix.S_IFMT)
	}
	// Only regular files are hardlinks in the format. Other multiply-linked
	// inodes are recorded name by name: overlayfs (since Linux 5.8) links
	// every whiteout to one shared 0:0 device, and each of those names is a
	// whiteout of its own.
	var linkKey *[2]uint64 // set: the first name of a multiply-linked file
	if e.Type == delta.TypeFile && st.Nlink > 1 {
		ino := [2]uint64{st.Dev, st.Ino}
		if s.opts.LinkID != nil && !fl.merged {
			var err error
			if ino, err = s.opts.LinkID(dirFD, name, rel, &st); err != nil {
				return delta.Entry{}, delta.ID{}, false, fmt.Errorf("scan %s: %w", s.where(rel), err)
			}
		}
		if primary, ok := s.links[ino]; ok {
			link := delta.Entry{Name: name, Type: delta.TypeHardlink, Target: primary}
			s.next.noteLink(rel, primary)
			return link, delta.ID{}, true, nil
		}
		linkKey = &ino
	}
	var err error
	if hit {
		// The cached entry is already translated, so Translate must be
		// idempotent: it sees the opaque flag here, not the raw xattr.
		e.Xattrs, e.Opaque = prev.Entry.Xattrs, prev.Entry.Opaque
	} else if e.Xattrs, err = fsat.Xattrs(dirFD, name, s.xbuf, nil); err != nil {
		return delta.Entry{}, delta.ID{}, false, fmt.Errorf("scan %s: %w", s.where(rel), err)
	}
	if s.opts.beforeOpen != nil {
		s.opts.beforeOpen(rel)
	}
	switch e.Type {
	case delta.TypeSymlink:
		if e.Target, err = fsat.Readlink(dirFD, name); err != nil {
			return delta.Entry{}, delta.ID{}, false, s.raced(rel, err)
		}
	case delta.TypeFile:
		if hit {
			e.SetContent(prev.Entry.Content())
			s.stats.CacheHits++
		} else if fresh, err = s.file(ctx, dirFD, rel, &st, &e); err != nil {
			return delta.Entry{}, delta.ID{}, false, err
		}
	}
	if s.opts.Translate != nil && !fl.merged {
		keep, err := s.opts.Translate(rel, &st, &e)
		if err != nil {
			return delta.Entry{}, delta.ID{}, false, fmt.Errorf("scan %s: %w", s.where(rel), err)
		}
		if !keep {
			return delta.Entry{}, delta.ID{}, false, nil
		}
	}
	var key delta.ID
	if e.Type == delta.TypeDir && !s.shallow {
		if e.Subtree, key, err = s.subdir(ctx, dirFD, rel, &st, &e, fl); err != nil {
			return delta.Entry{}, delta.ID{}, false, err
		}
	}
	if linkKey != nil {
		// Only now: a name that turned out to be gone or raced must not
		// become the target of later names.
		s.links[*linkKey] = rel
	}
	ce := CacheEntry{Key: fresh, Entry: e, Racy: fresh.CtimeNs >= s.racyAfter}
	if e.Type == delta.TypeDir {
		ce.State, ce.StateFlags = key, fl.bits()
	}
	ce.Entry.Name = ""
	s.next.Put(rel, ce)
	return e, key, true, nil
}

// raced maps the errors of an entry that is no longer what its stat said
// (now a symlink, now a directory, gone) to errRaced. EXDEV is openat2's
// RESOLVE_BENEATH answer when a rename races the lookup.
func (s *scanner) raced(rel string, err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ENOENT) ||
		errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENXIO) ||
		errors.Is(err, unix.EXDEV) {
		return errRaced
	}
	return fmt.Errorf("scan %s: %w", s.where(rel), err)
}

// subdir opens directory e (stat st) below dirFD, checks it is still the
// inode that was stat-ed, and scans it.
func (s *scanner) subdir(ctx context.Context, dirFD int, rel string, st *unix.Stat_t, e *delta.Entry, fl dirFlags) (delta.ID, delta.ID, error) {
	fd := -1
	if s.opts.Redirect != nil && !fl.merged {
		var err error
		if fd, err = s.opts.Redirect(dirFD, e.Name, rel, e); err != nil {
			return delta.ID{}, delta.ID{}, fmt.Errorf("scan %s: %w", s.where(rel), err)
		}
		fl.merged = fd >= 0
	}
	fl.opaque = fl.opaque || e.Opaque
	if fd < 0 {
		var err error
		if fd, err = fsat.Open(dirFD, e.Name, unix.O_RDONLY|unix.O_DIRECTORY); err != nil {
			return delta.ID{}, delta.ID{}, s.raced(rel, err)
		}
		var now unix.Stat_t
		if err := unix.Fstat(fd, &now); err != nil || !fsat.SameFile(&now, st) {
			unix.Close(fd)
			return delta.ID{}, delta.ID{}, errRaced
		}
	}
	defer unix.Close(fd)
	return s.dir(ctx, fd, rel, fl)
}
