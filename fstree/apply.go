package fstree

import (
	"context"
	"fmt"
	"os"
	"path"
	"runtime"
	"sync"

	"github.com/turnsnap/turnsnap/delta"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
)

// OpaqueXattr is how overlayfs marks an opaque directory on disk.
const OpaqueXattr = "trusted.overlay.opaque"

// ApplyOptions configures Materialise and ApplyLayer.
type ApplyOptions struct {
	Loader delta.BlobLoader
	// IDs is the home's content ID scheme, against which content already
	// in place is compared (pathrestore.Restore keeps an equal file).
	IDs delta.IDs
	// AllowDevices permits creating any character and block device node;
	// without it only those CheckDevice passes are made. Off by default: a
	// checkpoint is data from storage, and a device node restored into a
	// sandbox is a way out of it. Whiteouts (0:0) are always allowed.
	AllowDevices bool
	// Plain says the tree is a complete state (a base, a process image)
	// rather than a writable layer (StateRules.Plain).
	Plain bool
	// Placeholder, when set, makes every file entry a placeholder instead
	// of writing its chunks: the file gets its size (one hole, no block
	// written) and all its metadata, and then Placeholder is called with
	// its root-relative path, its entry and its open descriptor (after the
	// metadata, so what it adds stays). Lazy restore (overlay/lazy) fills
	// the placeholders on first access.
	Placeholder func(rel string, e *delta.Entry, fd int) error
	// Workers > 1 writes files with that many goroutines beside the walk
	// (Materialise only; a Placeholder must then be safe for concurrent
	// use). The result is the sequential apply's; what it buys is the
	// time of file creates and metadata, which a lazy restore's
	// placeholders are made of.
	Workers int
}

// ParallelWorkers is the Workers of an apply of many files: one per CPU,
// 2 to 8 (a create is system time, a copy waits on the disk).
func ParallelWorkers() int { return max(2, min(8, runtime.GOMAXPROCS(0))) }

// ApplyStats counts what an apply wrote.
type ApplyStats struct {
	Entries int64
	Files   int64
	Bytes   int64
}

// Materialise writes the state named by tree into dst, which must be an
// existing empty directory. Whiteouts and opaque directories are written in
// overlayfs's on-disk form (0:0 character devices, trusted.overlay.opaque=y),
// so the result can serve as an upper directory.
func Materialise(ctx context.Context, tree delta.ID, dst string, opts ApplyOptions) (ApplyStats, error) {
	return apply(ctx, tree, dst, opts, false)
}

// ApplyLayer writes tree, a writable layer in overlay upper form, onto the
// existing directory tree dst, so that dst becomes its old contents merged
// with tree the way overlayfs would merge them: a whiteout deletes the name,
// an opaque directory replaces whatever was there (its old contents are
// gone), any other directory is merged into an existing directory of the
// same name, and every other entry replaces the name with a new inode.
// Metadata is set exactly, xattrs included (xattrs the entry does not list
// are removed, except overlay's own trusted.overlay.* bookkeeping).
func ApplyLayer(ctx context.Context, tree delta.ID, dst string, opts ApplyOptions) (ApplyStats, error) {
	return apply(ctx, tree, dst, opts, true)
}

// apply is the one directory applier behind every restore.
//
// Safety (docs/FORMAT.md, "Safe apply and safe scan"): dst may hold
// anything, symlinks included, and none is ever followed: every directory
// is opened from its parent's descriptor with openat2
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, every name is created (O_EXCL, mkdirat, mknodat, symlinkat) or removed
// relative to that descriptor, and hardlinks may only point at files this
// call created. No host path is built from a tree's names, so paths of any
// length work. Chunks are verified by the loader as they are read, except
// files copied from a Source's directory. The caller syncs the filesystem
// and re-derives the tree to confirm the result (which a Source requires).
func apply(ctx context.Context, tree delta.ID, dst string, opts ApplyOptions, merge bool) (ApplyStats, error) {
	fp, err := checkBeforeApply(ctx, tree, dst, opts)
	if err != nil {
		return ApplyStats{}, err
	}
	fd, err := fsat.OpenDir(dst)
	if err != nil {
		return ApplyStats{}, fmt.Errorf("apply onto %s: %w", dst, err)
	}
	defer unix.Close(fd)
	a := &applier{opts: opts, root: dst, rootFD: fd, merge: merge, files: map[string]bool{}, budget: fp}
	if src, ok := opts.Loader.(Source); ok && !merge {
		// A directory that cannot be opened is no source: the store has it all.
		if sfd, err := fsat.OpenDir(src.Dir); err == nil {
			a.srcFD, a.hasSrc = sfd, true
			defer unix.Close(sfd)
		}
	}
	if opts.Workers > 1 && !merge {
		// The walk goes on making directories and the other entries in
		// tree order while the pool writes files; a worker's error cancels
		// the walk (ctx) and is the one returned.
		a.pool, ctx = errgroup.WithContext(ctx)
		a.pool.SetLimit(opts.Workers)
	}
	err = a.dir(ctx, fd, tree, "")
	if a.pool != nil {
		if perr := a.pool.Wait(); perr != nil {
			err = perr
		}
	}
	return a.stats, err
}

type applier struct {
	opts   ApplyOptions
	root   string
	rootFD int
	merge  bool            // onto existing contents (ApplyLayer), else upper form
	files  map[string]bool // root-relative paths of regular files created, for hardlinks
	stats  ApplyStats
	budget delta.Footprint // what CheckState found; a restore never writes more
	// anyLink lets a hardlink point at any regular file beneath the root,
	// not only one this call created: a diff apply links to files it kept.
	anyLink bool
	// mounted: a diff applied through the overlay mount of the planned
	// upper (DiffPlan.ApplyMounted), which writes no overlay marker.
	mounted bool
	// srcFD is the directory of a Source loader (Materialise only), used
	// only when hasSrc: files are copied from it, unverified (Source). The
	// flag, not fd -1, says so, because the zero applier of a diff or path
	// restore would otherwise copy from fd 0.
	srcFD  int
	hasSrc bool
	// pool, when set, writes the files (ApplyOptions.Workers); inflight
	// counts its files not done, which a hardlink waits for (its target
	// may be one); mu guards files and stats against it.
	pool     *errgroup.Group
	inflight sync.WaitGroup
	mu       sync.Mutex
}

func (a *applier) dir(ctx context.Context, dirFD int, id delta.ID, rel string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t, err := delta.LoadTree(ctx, a.opts.Loader, id)
	if err != nil {
		return fmt.Errorf("/%s: %w", rel, err)
	}
	// The pool's files of this directory are done before it returns, on
	// any path: its caller then sets the directory's metadata and closes
	// dirFD.
	var files sync.WaitGroup
	defer files.Wait()
	for i := range t.Entries {
		e := &t.Entries[i]
		p := path.Join(rel, e.Name)
		if a.pool != nil && e.Type == delta.TypeFile {
			if err := a.queueFile(ctx, dirFD, p, e, &files); err != nil {
				return err
			}
			continue
		}
		if err := a.entry(ctx, dirFD, p, e); err != nil {
			return fmt.Errorf("restore %s:/%s: %w", a.root, p, err)
		}
	}
	files.Wait()
	return ctx.Err() // a worker's error cancelled it
}

// queueFile hands file e (at rel, in dirFD) to the pool; files counts its directory's.
func (a *applier) queueFile(ctx context.Context, dirFD int, rel string, e *delta.Entry, files *sync.WaitGroup) error {
	if err := ctx.Err(); err != nil {
		return err // a worker failed
	}
	a.stats.Entries++
	if err := a.overBudget(); err != nil {
		return fmt.Errorf("restore %s:/%s: %w", a.root, rel, err)
	}
	files.Add(1)
	a.inflight.Add(1)
	a.pool.Go(func() error {
		defer a.inflight.Done()
		defer files.Done()
		if err := a.file(ctx, dirFD, rel, e); err != nil {
			return fmt.Errorf("restore %s:/%s: %w", a.root, rel, err)
		}
		return nil
	})
	return nil
}

// overBudget refuses an entry beyond what CheckState counted.
func (a *applier) overBudget() error {
	if uint64(a.stats.Entries) > a.budget.Entries {
		return fmt.Errorf("more entries than the checked tree holds: %w", errdefs.ErrCorrupt)
	}
	return nil
}

func (a *applier) entry(ctx context.Context, dirFD int, rel string, e *delta.Entry) error {
	a.stats.Entries++
	if err := a.overBudget(); err != nil {
		return err
	}
	if a.merge {
		var st unix.Stat_t
		exists := unix.Fstatat(dirFD, e.Name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
		if e.Type == delta.TypeDir && !e.Opaque && exists && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return a.subdir(ctx, dirFD, rel, e) // merge into the existing directory
		}
		if exists {
			if err := removeAt(dirFD, e.Name); err != nil {
				return err
			}
		}
		if e.Type == delta.TypeWhiteout {
			return nil
		}
	}
	switch e.Type {
	case delta.TypeDir:
		if err := unix.Mkdirat(dirFD, e.Name, 0o700); err != nil {
			return err
		}
		return a.subdir(ctx, dirFD, rel, e)
	case delta.TypeFile:
		return a.file(ctx, dirFD, rel, e)
	case delta.TypeHardlink:
		if a.pool != nil {
			a.inflight.Wait() // its target may be a file in flight
		}
		return a.hardlink(dirFD, e)
	case delta.TypeWhiteout:
		return unix.Mknodat(dirFD, e.Name, unix.S_IFCHR, 0) // overlay's own form
	case delta.TypeSymlink:
		if err := unix.Symlinkat(e.Target, dirFD, e.Name); err != nil {
			return err
		}
	case delta.TypeFIFO, delta.TypeSocket, delta.TypeCharDev, delta.TypeBlockDev:
		kind := map[delta.Type]uint32{delta.TypeFIFO: unix.S_IFIFO, delta.TypeSocket: unix.S_IFSOCK, delta.TypeCharDev: unix.S_IFCHR, delta.TypeBlockDev: unix.S_IFBLK}[e.Type]
		if !a.opts.AllowDevices {
			if err := delta.CheckDevice(*e); err != nil {
				return err
			}
		}
		if err := unix.Mknodat(dirFD, e.Name, kind|0o600, int(e.Rdev)); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown entry type %d: %w", e.Type, errdefs.ErrCorrupt)
	}
	return setMeta(metaTarget{dirFD: dirFD, name: e.Name, fd: -1}, e)
}

func (a *applier) hardlink(dirFD int, e *delta.Entry) error {
	if !a.files[e.Target] && !a.anyLink {
		return fmt.Errorf("hardlink to %q, which is not a file restored before it: %w", e.Target, errdefs.ErrCorrupt)
	}
	tfd, err := fsat.Open(a.rootFD, e.Target, unix.O_PATH)
	if err != nil {
		return fmt.Errorf("hardlink target %s: %w", e.Target, err)
	}
	defer unix.Close(tfd)
	var st unix.Stat_t
	if err := unix.Fstat(tfd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("hardlink target %s is no longer the file restored: %w", e.Target, errdefs.ErrPrecondition)
	}
	// A second name carries no metadata of its own.
	return unix.Linkat(tfd, "", dirFD, e.Name, unix.AT_EMPTY_PATH)
}

func (a *applier) subdir(ctx context.Context, dirFD int, rel string, e *delta.Entry) error {
	fd, err := fsat.Open(dirFD, e.Name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := a.dir(ctx, fd, e.Subtree, rel); err != nil {
		return err
	}
	// Merged, an opaque directory was created fresh above and simply holds
	// nothing else; in upper form it carries overlay's marker.
	if e.Opaque && !a.merge {
		if err := unix.Fsetxattr(fd, OpaqueXattr, []byte("y"), 0); err != nil {
			return fmt.Errorf("mark opaque: %w", err)
		}
	}
	return setMeta(metaTarget{fd: fd}, e)
}

func (a *applier) file(ctx context.Context, dirFD int, rel string, e *delta.Entry) error {
	fd, err := unix.Openat(dirFD, e.Name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), e.Name)
	defer f.Close()
	var n uint64
	copied := false
	switch {
	case a.opts.Placeholder != nil:
		err = f.Truncate(int64(e.Size))
	case a.hasSrc:
		n, copied, err = copyFromSource(a.srcFD, rel, f, e)
	}
	if err == nil && a.opts.Placeholder == nil && !copied {
		n, err = writeChunks(ctx, a.opts.Loader, f, e)
	}
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.files[rel] = true
	a.stats.Files++
	a.stats.Bytes += int64(n)
	a.mu.Unlock()
	if err := setMeta(metaTarget{fd: fd}, e); err != nil {
		return err
	}
	if a.opts.Placeholder != nil {
		if err := a.opts.Placeholder(rel, e, fd); err != nil {
			return err
		}
	}
	return f.Close()
}

// writeChunks writes a fresh file's content (WriteContent: holes stay holes).
func writeChunks(ctx context.Context, loader delta.BlobLoader, f *os.File, e *delta.Entry) (uint64, error) {
	return WriteContent(ctx, loader, f, e, false)
}

// checkBeforeApply runs CheckState for a restore into dst and refuses one
// that cannot fit, before anything is written: a restore that ran out of
// space midway would have done all its work for nothing.
func checkBeforeApply(ctx context.Context, tree delta.ID, dst string, opts ApplyOptions) (delta.Footprint, error) {
	fp, err := delta.CheckState(ctx, opts.Loader, tree, delta.StateRules{Plain: opts.Plain})
	if err != nil {
		return fp, fmt.Errorf("tree %s: %w", tree.Short(), err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dst, &fs); err != nil {
		return fp, fmt.Errorf("restore into %s: %w", dst, err)
	}
	free := fs.Bavail * uint64(fs.Bsize)
	if fp.Bytes > free {
		return fp, fmt.Errorf("restore into %s: tree %s needs %d bytes, the filesystem has %d free: %w",
			dst, tree.Short(), fp.Bytes, free, errdefs.ErrNoSpace)
	}
	// Filesystems with dynamic inodes (btrfs) report none at all.
	if fs.Files > 0 && fp.Entries > fs.Ffree {
		return fp, fmt.Errorf("restore into %s: tree %s needs %d inodes, the filesystem has %d free: %w",
			dst, tree.Short(), fp.Entries, fs.Ffree, errdefs.ErrNoSpace)
	}
	return fp, nil
}
