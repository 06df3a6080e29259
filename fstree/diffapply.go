package fstree

import (
	"context"
	"errors"
	"fmt"
	"github.com/turnsnap/turnsnap/delta"
	"os"
	"path"
	"slices"
	"strconv"
	"sync"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// DiffResult reports an applied diff.
type DiffResult struct {
	Stats ApplyStats
	// Removed lists the root-relative paths removed or replaced (a
	// directory's contents went with it).
	Removed []string
	// Written lists the root-relative paths created, rewritten or given
	// new metadata, in the order they were written.
	Written []string
	// BaseCopies lists the paths (also in Removed) where a mounted apply
	// wrote a copy of the lower's file instead of removing the upper's
	// entry (diffbase.go): the layer holds them beyond the target tree.
	BaseCopies []string
}

// ErrPartial marks an error of Apply after its first write: the directory
// is neither its old state nor the target, and applying a fresh plan from
// what it holds now finishes the job.
var ErrPartial = errors.New("the restore stopped partway")

// Apply makes the changes of the plan in the directory it was planned on.
// Nothing outside it is touched and no symlink is followed (every name is
// resolved from its parent's descriptor, as in Materialise). Files that
// exist in both states are rewritten through O_NOFOLLOW|O_TRUNC after a
// check that they are still regular files, so they keep their inodes. An
// error after the first write wraps ErrPartial.
func (p *DiffPlan) Apply(ctx context.Context) (*DiffResult, error) {
	return p.applyAt(ctx, p.root, false)
}

// applyAt is Apply writing through root: the planned directory itself,
// or (mounted) an overlay mount whose upper it is (ApplyMounted).
func (p *DiffPlan) applyAt(ctx context.Context, root string, mounted bool) (*DiffResult, error) {
	rootFD, err := fsat.OpenDir(root)
	if err != nil {
		return nil, fmt.Errorf("restore onto %s: %w", root, err)
	}
	defer unix.Close(rootFD)
	a := &applier{opts: ApplyOptions{Loader: p, AllowDevices: p.opts.AllowDevices, Plain: p.opts.Plain},
		root: root, rootFD: rootFD, files: map[string]bool{}, anyLink: true,
		budget: delta.Footprint{Entries: delta.MaxStateEntries}, mounted: mounted}
	res := &DiffResult{}
	for i := range p.changes {
		c := &p.changes[i]
		if err := p.apply(ctx, a, c, res); err != nil {
			err = fmt.Errorf("restore %s:/%s: %w", root, c.rel, err)
			if i > 0 || len(res.Removed)+len(res.Written) > 0 {
				err = fmt.Errorf("%w: %w", ErrPartial, err)
			}
			return res, err
		}
		if i == 0 && p.opts.Phase != nil {
			p.opts.Phase()
		}
	}
	res.Stats = a.stats
	return res, nil
}

func (p *DiffPlan) apply(ctx context.Context, a *applier, c *change, res *DiffResult) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	dir, name := splitRel(c.rel)
	dirFD, err := fsat.Open(a.rootFD, dir, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(dirFD)
	if how, ok := p.base[c.rel]; ok && a.mounted {
		return p.applyBase(ctx, a, dirFD, name, c, how, res)
	}
	if c.remove {
		remove := p.remove
		if a.mounted {
			// Through the mount, overlay keeps its own index and
			// whiteouts as for any other unlink.
			remove = func(dirFD int, name, _ string) error { return removeAt(dirFD, name) }
		}
		if err := remove(dirFD, name, c.rel); err != nil {
			return err
		}
		res.Removed = append(res.Removed, c.rel)
	}
	if c.target == nil {
		return nil
	}
	res.Written = append(res.Written, c.rel)
	e := c.target
	switch c.how {
	case changeCreate:
		if e.Type == delta.TypeFile {
			a.files[c.rel] = true
		}
		return a.entry(ctx, dirFD, c.rel, e)
	case changeRewrite, changeMeta:
		if e.Type != delta.TypeFile {
			// A node kept (fifo, socket, device): its kind is checked by
			// the plan's scan, and metadata is set without following.
			var st unix.Stat_t
			if err := unix.Fstatat(dirFD, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
			if st.Mode&unix.S_IFMT == unix.S_IFDIR || st.Mode&unix.S_IFMT == unix.S_IFLNK || st.Mode&unix.S_IFMT == unix.S_IFREG {
				return fmt.Errorf("is no longer the %s the live state had: %w", e.Type, errdefs.ErrPrecondition)
			}
			return setMeta(metaTarget{dirFD: dirFD, name: name, fd: -1}, e)
		}
		return p.rewrite(ctx, a, dirFD, name, e, c.how == changeRewrite)
	case changeDirMeta:
		fd, err := fsat.Open(dirFD, name, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		// Mounted, the marker is overlay's and not settable through the
		// mount; Mountable made sure it does not change.
		if !a.mounted {
			if err := setOpaque(fd, e.Opaque); err != nil {
				return err
			}
		}
		return setMeta(metaTarget{fd: fd}, e)
	}
	return fmt.Errorf("unknown change %d", c.how)
}

// rewrite writes a file that exists in both states in place. It is opened
// O_PATH first and checked to be a regular file (a fifo or a device must
// never be opened for writing), then reopened for writing through its own
// descriptor, which follows nothing.
func (p *DiffPlan) rewrite(ctx context.Context, a *applier, dirFD int, name string, e *delta.Entry, content bool) error {
	pfd, err := fsat.Open(dirFD, name, unix.O_PATH)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("is no longer a regular file: %w", errdefs.ErrPrecondition)
	}
	flags := unix.O_RDONLY
	if content {
		flags = unix.O_WRONLY | unix.O_TRUNC
	}
	// The magic link is our own descriptor of the checked inode: opening it
	// reaches that inode whatever its name points at now.
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if content {
		n, err := writeChunks(ctx, a.opts.Loader, f, e)
		if err != nil {
			return err
		}
		a.stats.Files++
		a.stats.Bytes += int64(n)
	}
	a.stats.Entries++
	if err := setMeta(metaTarget{fd: fd}, e); err != nil {
		return err
	}
	return f.Close()
}

// remove deletes name (a whole tree for a directory), telling
// Options.Removing about each name first, deepest last.
func (p *DiffPlan) remove(dirFD int, name, rel string) error {
	if p.opts.Removing == nil {
		return removeAt(dirFD, name)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dirFD, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return ignoreENOENT(err)
	}
	if err := p.opts.Removing(dirFD, name, rel); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return ignoreENOENT(unix.Unlinkat(dirFD, name, 0))
	}
	fd, err := fsat.Open(dirFD, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	names, err := fsat.ReadDirNames(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := p.remove(fd, n, path.Join(rel, n)); err != nil {
			return err
		}
	}
	return ignoreENOENT(unix.Unlinkat(dirFD, name, unix.AT_REMOVEDIR))
}

// setOpaque sets or clears overlay's opaque marker on a kept directory.
func setOpaque(fd int, opaque bool) error {
	if opaque {
		if err := unix.Fsetxattr(fd, OpaqueXattr, []byte("y"), 0); err != nil {
			return fmt.Errorf("mark opaque: %w", err)
		}
		return nil
	}
	if err := unix.Fremovexattr(fd, OpaqueXattr); err != nil && !errors.Is(err, unix.ENODATA) {
		return fmt.Errorf("clear opaque: %w", err)
	}
	return nil
}

// Verify reads back every name the plan wrote and checks it against the
// target, and lists every kept directory whose children changed against
// the target's names. It returns the scan cache entries of what it read,
// so the caller can update its cache without a full scan.
//
// Why this is enough: the live tree came from a scan of the directory, and
// nothing but Apply wrote to it since (the caller guarantees that: the
// sandbox's processes are stopped, and the overlay is unmounted or, for
// ApplyMounted, written through by Apply alone). Names the
// plan did not touch were equal in both trees; names it touched are read
// back here, content hashed, metadata compared; and the names of every
// directory it changed are listed. So every entry of the result equals the
// target's, and by induction over the directories the result's tree is
// the target tree.
func (p *DiffPlan) Verify(ctx context.Context, res *DiffResult) (map[string]CacheEntry, error) {
	rootFD, err := fsat.OpenDir(p.root)
	if err != nil {
		return nil, fmt.Errorf("verify %s: %w", p.root, err)
	}
	defer unix.Close(rootFD)
	s := &scanner{
		opts: ScanOptions{IDs: p.opts.IDs, Translate: p.opts.Translate, Residue: p.opts.Residue, Quiescent: true}, root: p.root,
		next:  NewScanCache(),
		links: map[[2]uint64]string{}, xbuf: make([]byte, xattrBufSize),
		racyAfter: 1<<63 - 1, empty: p.opts.IDs.EmptyTree(),
	}
	// Hash only, on this goroutine: a verify saves nothing, and the few
	// files a diff wrote do not pay for a pipeline.
	s.files = NewFileReader(p.opts.IDs, nil, &s.stats, 1)
	defer s.files.Close()
	dbuf := make([]byte, fsat.DirBufSize)
	for rel, want := range p.dirs {
		if err := sameNames(rootFD, rel, p.namesWithCopies(rel, want), dbuf); err != nil {
			return nil, fmt.Errorf("verify %s:/%s: %w", p.root, rel, err)
		}
	}
	for i := range p.changes {
		c := &p.changes[i]
		if err := p.verifyOne(ctx, s, rootFD, c); err != nil {
			return nil, fmt.Errorf("verify %s:/%s: %w", p.root, c.rel, err)
		}
		if c.how == changeDirMeta {
			p.noteState(c.rel, c.target, s.next.entries) // its children came first
		}
	}
	if _, ok := p.kept[""]; ok {
		p.stateKey, _ = p.stateOf("", s.next.entries)
	}
	return s.next.entries, nil
}

// sameNames checks that directory rel holds exactly the names want
// (sorted): each name listed is found in want, and as many as want has (a
// directory holds no name twice). It neither allocates nor sorts the
// listing: a rollback lists every directory whose children it changed.
func sameNames(rootFD int, rel string, want []string, buf []byte) error {
	fd, err := fsat.Open(rootFD, rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	n := 0
	var extra string
	err = fsat.EachDirName(fd, buf, func(name []byte) error {
		n++
		lo, hi := 0, len(want)
		for lo < hi {
			if m := int(uint(lo+hi) >> 1); want[m] < string(name) {
				lo = m + 1
			} else {
				hi = m
			}
		}
		if extra == "" && (lo == len(want) || want[lo] != string(name)) {
			extra = string(name)
		}
		return nil
	})
	switch {
	case err != nil:
		return err
	case extra != "":
		return fmt.Errorf("holds %d names, the target %d, %q not among them: %w", n, len(want), extra, errdefs.ErrCorrupt)
	case n != len(want):
		return fmt.Errorf("holds %d names, the target %d: %w", n, len(want), errdefs.ErrCorrupt)
	}
	return nil
}

func (p *DiffPlan) verifyOne(ctx context.Context, s *scanner, rootFD int, c *change) error {
	dir, name := splitRel(c.rel)
	dirFD, err := fsat.Open(rootFD, dir, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(dirFD)
	switch p.base[c.rel] {
	case baseCopy:
		return p.verifyBaseCopy(ctx, c.rel)
	case baseDir:
		return p.verifyBaseDir(ctx, c.rel, 0)
	}
	if c.target == nil {
		var st unix.Stat_t
		if err := unix.Fstatat(dirFD, name, &st, unix.AT_SYMLINK_NOFOLLOW); !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("still there after its removal: %w", errdefs.ErrCorrupt)
		}
		return nil
	}
	want := c.target
	if want.Type == delta.TypeHardlink {
		var a, b unix.Stat_t
		if err := fsat.Lstat(dirFD, name, &a); err != nil {
			return err
		}
		if err := fsat.Lstat(rootFD, want.Target, &b); err != nil {
			return err
		}
		if !fsat.SameFile(&a, &b) {
			return fmt.Errorf("is not a link to %s: %w", want.Target, errdefs.ErrCorrupt)
		}
		return nil
	}
	s.shallow = c.how == changeDirMeta
	got, _, keep, err := s.entry(ctx, dirFD, c.rel, name, p.kept[dir].flags)
	if err != nil {
		return err
	}
	if !keep {
		return fmt.Errorf("vanished: %w", errdefs.ErrCorrupt)
	}
	if c.how == changeDirMeta {
		got.Subtree = want.Subtree // its children are checked one by one
	}
	if !sameEntry(&got, want) {
		return fmt.Errorf("reads back as %s mode %o size %d, the target is %s mode %o size %d: %w",
			got.Type, got.Mode, got.Size, want.Type, want.Mode, want.Size, errdefs.ErrCorrupt)
	}
	return nil
}

// Sync makes what Apply wrote durable: an fsync of every file and
// directory Verify read back (fresh), and of every directory a name was
// removed from or added to. It replaces a syncfs of the whole filesystem,
// which would also wait for every other writer's dirty data there. The
// fsyncs run side by side: a journaling filesystem commits concurrent
// fsyncs in one transaction (ext4's jbd2, xfs's log force), so a diff of
// a few names waits for about one journal commit, not one per name, and
// every name is still synced by its own fsync before Sync returns.
func (p *DiffPlan) Sync(res *DiffResult, fresh map[string]CacheEntry) error {
	rootFD, err := fsat.OpenDir(p.root)
	if err != nil {
		return fmt.Errorf("sync %s: %w", p.root, err)
	}
	defer unix.Close(rootFD)
	todo := map[string]bool{"": true}
	for rel, ce := range fresh {
		if ce.Entry.Type == delta.TypeFile || ce.Entry.Type == delta.TypeDir {
			todo[rel] = true
		}
		dir, _ := splitRel(rel)
		todo[dir] = true
	}
	for _, rel := range res.Removed {
		dir, _ := splitRel(rel)
		todo[dir] = true
	}
	for _, rel := range res.BaseCopies {
		dir, _ := splitRel(rel)
		todo[dir] = true
		// A copied file's content; a symlink is synced with its directory.
		var st unix.Stat_t
		if fsat.Lstat(rootFD, rel, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFLNK {
			todo[rel] = true
		}
	}
	rels := make([]string, 0, len(todo))
	for rel := range todo {
		rels = append(rels, rel)
	}
	slices.Sort(rels) // the first error reported is the same from run to run
	errs := make([]error, len(rels))
	var wg sync.WaitGroup
	work := make(chan int)
	for range min(len(rels), syncWorkers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				errs[i] = syncAt(rootFD, rels[i])
			}
		}()
	}
	for i := range rels {
		work <- i
	}
	close(work)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("sync %s:/%s: %w", p.root, rels[i], err)
		}
	}
	return nil
}

// syncWorkers bounds the fsyncs Sync has in flight (each holds a thread
// while it waits for the disk).
const syncWorkers = 16

func syncAt(rootFD int, rel string) error {
	fd, err := fsat.Open(rootFD, rel, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsync(fd)
}
