package fstree

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strconv"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// Base names through the mount (docs/TRACKING.md, "Rollback of base
// files"). Agents mostly edit the files of the base, and a rollback that
// undoes such an edit must make the name show the base's file again. On
// the unmounted upper that is a removal; through the mount it cannot be
// (a removal there leaves a whiteout), and unmounting costs the rollback
// its mount, the host filesystem's syncfs and the tracker. So through the
// mount the restore writes the base's file back instead: the merged view
// is exactly the target's, and the upper keeps a copy equal to the lower.
//
// The layer then holds more than the target tree: a layer tree that
// differs, a merged state that does not. Everything that decides on
// states compares merged views where layer trees differ: a turn is a skip
// when its merged state is the head's (engine's mergedChanged), a receipt
// matches when the merged states agree (OnlyRestoreNoise with no change),
// and a later checkpoint that records the copy restores, anywhere, to the
// same merged view. The copies are bounded: a rollback copies at most
// MaxBaseCopyBytes this way (more goes through the unmounted path, which
// removes them), each copy replaces the upper entry the agent's edit had
// made at that name, and any unmounted restore or rebuild drops every
// copy its target lacks.
//
// The other writes to names the lower holds are exact through the mount
// too: a file the live upper holds (a copied-up or recreated base file)
// is rewritten in place in the upper; a target file, symlink or node
// where the live upper has none (or a whiteout) is written after an
// unlink through the mount, which leaves a whiteout that the create
// replaces; a target whiteout is an unlink through the mount.

// MaxBaseCopyBytes bounds the bytes of base files one mounted diff copies
// back (baseCopy); a diff that would copy more is applied to the
// unmounted upper, where bringing a base file back is a removal.
const MaxBaseCopyBytes = 16 << 20

// baseHow is how ApplyMounted writes a changed name the lower holds.
type baseHow uint8

const (
	baseInPlace baseHow = iota // a live upper file rewritten in place: no special care
	baseCopy                   // the target has no upper entry: write the lower's file back
	baseOver                   // the target's entry replaces the lower's: unlink through the mount, then create
	baseDir                    // the target has no upper entry for a base directory the live upper holds: each name below made the lower's again, the directory given the lower's metadata
	baseDirOver                // the target's upper directory over a base directory the live upper lacks: its names written into the merged directory, its metadata set (overlay copies the directory up)
)

// baseName is what the lower holds at a name.
type baseName struct {
	present bool // anything, or it cannot be told
	// copyable: a regular file with one link and no holes, or a symlink
	// without xattrs, reached through directories only, so a copy
	// written through the mount reads back equal to it.
	copyable bool
	dir      bool
	size     int64
}

// baseAt looks rel up in the lower layer open as lowerFD, following no
// symlink: anything but "no such name" counts as present.
func baseAt(lowerFD int, rel string) (baseName, error) {
	var st unix.Stat_t
	err := fsat.Lstat(lowerFD, rel, &st)
	switch {
	case errors.Is(err, unix.ENOENT):
		return baseName{}, nil
	case err != nil:
		return baseName{present: true}, nil // a symlink or a file on the way: the unmounted path
	}
	b := baseName{present: true, dir: st.Mode&unix.S_IFMT == unix.S_IFDIR, size: st.Size}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		b.copyable = st.Nlink == 1 && st.Blocks*512 >= st.Size
	case unix.S_IFLNK:
		dir, name := splitRel(rel)
		dfd, err := fsat.Open(lowerFD, dir, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return b, nil
		}
		defer unix.Close(dfd)
		buf := make([]byte, 256)
		n, err := unix.Llistxattr(fsat.ProcPath(dfd, name), buf)
		b.copyable = err == nil && n == 0
	}
	return b, nil
}

// baseRule says how change c, at a name the lower holds (b), is written
// through the mount, or why it cannot be ("").
func baseRule(c *change, b baseName) (baseHow, string) {
	switch {
	case c.opaque:
		return 0, "below an opaque directory"
	case b.dir && c.target == nil && c.live != nil && c.live.Type == delta.TypeDir && !c.live.Opaque:
		return baseDir, "" // Mountable checks below it (baseDirRule, copies)
	case b.dir && c.target != nil && c.target.Type == delta.TypeDir && !c.target.Opaque && c.live == nil && c.how == changeCreate:
		return baseDirOver, "" // Mountable checks below it (baseDirRule)
	case b.dir:
		return 0, "a base directory"
	case c.live != nil && c.live.Type == delta.TypeDir:
		return 0, "a directory over a base file"
	case c.target == nil:
		if !b.copyable {
			return 0, "a hardlinked, sparse or special base file"
		}
		return baseCopy, ""
	case c.target.Type == delta.TypeDir || c.target.Type == delta.TypeHardlink:
		return 0, "a directory or hardlink over a base file"
	case c.how == changeRewrite || c.how == changeMeta:
		return baseInPlace, "" // the upper holds the name: written there
	}
	return baseOver, ""
}

// applyBase is apply of a change Mountable gave a base rule, through the
// mount (dirFD is the name's directory there).
func (p *DiffPlan) applyBase(ctx context.Context, a *applier, dirFD int, name string, c *change, how baseHow, res *DiffResult) error {
	switch how {
	case baseCopy:
		if err := p.copyBase(ctx, a, dirFD, name, c.rel, c.live); err != nil {
			return err
		}
		res.Removed = append(res.Removed, c.rel)
		res.BaseCopies = append(res.BaseCopies, c.rel)
		return nil
	case baseDir, baseDirOver:
		lowerFD, err := fsat.OpenDir(p.lower)
		if err != nil {
			return err
		}
		defer unix.Close(lowerFD)
		if how == baseDirOver {
			res.Written = append(res.Written, c.rel) // Verify reads the whole directory back
			return p.mergeDir(ctx, a, lowerFD, dirFD, name, c.rel, c.target, 0)
		}
		res.Removed = append(res.Removed, c.rel)
		return p.copyBaseDir(ctx, a, lowerFD, dirFD, name, c.rel, c.live, 0, res)
	}
	// baseOver: the unlink leaves a whiteout (the lower holds the name),
	// which the create replaces; a target whiteout is that unlink alone.
	if err := ignoreENOENT(unix.Unlinkat(dirFD, name, 0)); err != nil {
		return err
	}
	if c.remove {
		res.Removed = append(res.Removed, c.rel)
	}
	res.Written = append(res.Written, c.rel)
	if c.target.Type == delta.TypeWhiteout {
		return nil
	}
	if c.target.Type == delta.TypeFile {
		a.files[c.rel] = true
	}
	return a.entry(ctx, dirFD, c.rel, c.target)
}

// copyBase makes name (in dirFD, the mount) a copy of the lower's file at
// c.rel: content, mode, owner, xattrs and mtime. A regular file the upper
// holds is rewritten in place (it keeps its inode); anything else is
// unlinked through the mount first.
func (p *DiffPlan) copyBase(ctx context.Context, a *applier, dirFD int, name, rel string, live *delta.Entry) error {
	want, src, err := p.lowerEntry(ctx, rel, true)
	if err != nil {
		return err
	}
	if src != nil {
		defer src.Close()
	}
	if want.Type == delta.TypeSymlink {
		if err := ignoreENOENT(unix.Unlinkat(dirFD, name, 0)); err != nil {
			return err
		}
		if err := unix.Symlinkat(want.Target, dirFD, name); err != nil {
			return err
		}
		a.stats.Entries++
		return setMeta(metaTarget{dirFD: dirFD, name: name, fd: -1}, &want)
	}
	var fd int
	if live != nil && live.Type == delta.TypeFile {
		pfd, err := fsat.Open(dirFD, name, unix.O_PATH)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		err = unix.Fstat(pfd, &st)
		if err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
			err = fmt.Errorf("is no longer a regular file: %w", errdefs.ErrPrecondition)
		}
		if err == nil {
			fd, err = unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC, 0)
		}
		unix.Close(pfd)
		if err != nil {
			return err
		}
	} else {
		if err := ignoreENOENT(unix.Unlinkat(dirFD, name, 0)); err != nil {
			return err
		}
		if fd, err = unix.Openat(dirFD, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600); err != nil {
			return err
		}
	}
	dst := os.NewFile(uintptr(fd), name)
	defer dst.Close()
	n, err := io.Copy(dst, src)
	if err != nil {
		return fmt.Errorf("copy the base's file: %w", err)
	}
	if n != int64(want.Size) {
		return fmt.Errorf("the base's file changed while it was copied: %w", errdefs.ErrPrecondition)
	}
	a.stats.Entries++
	a.stats.Files++
	a.stats.Bytes += n
	if err := setMeta(metaTarget{fd: fd}, &want); err != nil {
		return err
	}
	return dst.Close()
}

// lowerEntry reads the lower's entry at rel as a scan of the upper would
// (Translate included), content hashed; with open, it also returns the
// regular file open for reading (nil for a symlink).
func (p *DiffPlan) lowerEntry(ctx context.Context, rel string, open bool) (delta.Entry, *os.File, error) {
	e, err := p.entryAt(ctx, p.lower, rel)
	if err != nil || !open || e.Type != delta.TypeFile {
		return e, nil, err
	}
	lowerFD, err := fsat.OpenDir(p.lower)
	if err != nil {
		return e, nil, err
	}
	defer unix.Close(lowerFD)
	fd, err := fsat.Open(lowerFD, rel, unix.O_RDONLY|unix.O_NOFOLLOW)
	if err != nil {
		return e, nil, fmt.Errorf("open the base's file: %w", err)
	}
	return e, os.NewFile(uintptr(fd), rel), nil
}

// entryAt scans the one entry rel below root (not into the plan's cache).
func (p *DiffPlan) entryAt(ctx context.Context, root, rel string) (delta.Entry, error) {
	rootFD, err := fsat.OpenDir(root)
	if err != nil {
		return delta.Entry{}, err
	}
	defer unix.Close(rootFD)
	dir, name := splitRel(rel)
	dirFD, err := fsat.Open(rootFD, dir, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return delta.Entry{}, err
	}
	defer unix.Close(dirFD)
	s := &scanner{
		opts: ScanOptions{IDs: p.opts.IDs, Translate: p.opts.Translate, Quiescent: true}, root: root,
		next: NewScanCache(), links: map[[2]uint64]string{}, xbuf: make([]byte, xattrBufSize),
		racyAfter: 1<<63 - 1, empty: p.opts.IDs.EmptyTree(), shallow: true,
	}
	s.files = NewFileReader(p.opts.IDs, nil, &s.stats, 1)
	defer s.files.Close()
	e, _, ok, err := s.entry(ctx, dirFD, rel, name, dirFlags{})
	if err != nil {
		return delta.Entry{}, err
	}
	if !ok {
		return delta.Entry{}, fmt.Errorf("vanished: %w", errdefs.ErrCorrupt)
	}
	return e, nil
}

// verifyBaseCopy checks that the upper's entry at rel reads back equal to
// the lower's.
func (p *DiffPlan) verifyBaseCopy(ctx context.Context, rel string) error {
	want, _, err := p.lowerEntry(ctx, rel, false)
	if err != nil {
		return fmt.Errorf("the base's file: %w", err)
	}
	got, err := p.entryAt(ctx, p.root, rel)
	if err != nil {
		return err
	}
	if !sameEntry(&got, &want) {
		return fmt.Errorf("reads back as %s mode %o size %d, the base's is %s mode %o size %d: %w",
			got.Type, got.Mode, got.Size, want.Type, want.Mode, want.Size, errdefs.ErrCorrupt)
	}
	return nil
}

// namesWithCopies is the names Verify wants in directory rel: the
// target's, and the base copies written there.
func (p *DiffPlan) namesWithCopies(rel string, want []string) []string {
	var extra []string
	for r, how := range p.base {
		if how != baseCopy && how != baseDir {
			continue
		}
		if dir, name := splitRel(r); dir == rel {
			extra = append(extra, name)
		}
	}
	if len(extra) == 0 {
		return want
	}
	out := append(slices.Clone(want), extra...)
	slices.Sort(out)
	return out
}

// baseDirRule checks directory e (at rel, read through l) over a base
// directory: every name below it must be one the mount writes exactly.
// With copies, e is the live upper's and the target lacks it (baseDir):
// each base name below is made the lower's again, so a file must be one
// a copy reproduces, and its bytes are counted. Without, e is the
// target's over a base directory the live upper lacks (baseDirOver). It
// returns the bytes to copy, or why not.
func (p *DiffPlan) baseDirRule(ctx context.Context, l delta.BlobLoader, lowerFD int, rel string, e *delta.Entry, depth int, copies bool) (int64, string, error) {
	kids, err := baseChildren(ctx, l, lowerFD, rel, e, depth)
	if err != nil {
		return 0, "", err
	}
	var bytes int64
	for _, k := range kids {
		ce, crel, b := k.e, k.rel, k.b
		switch {
		case !b.present:
			if why, err := overlayForms(ctx, l, ce, crel, depth+1); why != "" || err != nil {
				return 0, why, err
			}
		case ce.Type == delta.TypeDir && b.dir && !ce.Opaque:
			n, why, err := p.baseDirRule(ctx, l, lowerFD, crel, ce, depth+1, copies)
			if why != "" || err != nil {
				return 0, why, err
			}
			bytes += n
		case ce.Type != delta.TypeDir && ce.Type != delta.TypeHardlink && !b.dir && (b.copyable || !copies):
			if copies {
				bytes += b.size
			}
		default:
			return 0, fmt.Sprintf("/%s is in the lower layer: not a plain name on both sides", crel), nil
		}
	}
	return bytes, "", nil
}

// baseChild is a name below a directory walked over a base directory:
// its entry, its path, and what the lower holds there.
type baseChild struct {
	e   *delta.Entry
	rel string
	b   baseName
}

// baseChildren reads directory e's subtree (at rel, depth directories
// down) through l, and looks each name up in the lower (lowerFD): the
// walks below a base directory.
func baseChildren(ctx context.Context, l delta.BlobLoader, lowerFD int, rel string, e *delta.Entry, depth int) ([]baseChild, error) {
	if depth > delta.MaxDepth {
		return nil, delta.CorruptAt(rel, "directories nested more than %d deep", delta.MaxDepth)
	}
	t, err := delta.LoadTree(ctx, l, e.Subtree)
	if err != nil {
		return nil, fmt.Errorf("/%s: %w", rel, err)
	}
	out := make([]baseChild, len(t.Entries))
	for i := range t.Entries {
		c := &out[i]
		c.e, c.rel = &t.Entries[i], path.Join(rel, t.Entries[i].Name)
		if c.b, err = baseAt(lowerFD, c.rel); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// copyBaseDir makes directory name (in dirFD, the mount; e its live entry)
// the lower's (lowerFD) again: each name below it that the lower holds is
// made the lower's (a copy), each it lacks is removed, and the directory
// gets the lower's metadata last (its children moved its mtime).
func (p *DiffPlan) copyBaseDir(ctx context.Context, a *applier, lowerFD, dirFD int, name, rel string, e *delta.Entry, depth int, res *DiffResult) error {
	kids, err := baseChildren(ctx, p.opts.Live, lowerFD, rel, e, depth)
	if err != nil {
		return err
	}
	fd, err := fsat.Open(dirFD, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	for _, k := range kids {
		ce, crel, b := k.e, k.rel, k.b
		switch {
		case !b.present:
			if err := removeAt(fd, ce.Name); err != nil {
				return err
			}
		case b.dir:
			if err := p.copyBaseDir(ctx, a, lowerFD, fd, ce.Name, crel, ce, depth+1, res); err != nil {
				return err
			}
		default:
			if err := p.copyBase(ctx, a, fd, ce.Name, crel, ce); err != nil {
				return err
			}
			res.BaseCopies = append(res.BaseCopies, crel)
		}
	}
	want, err := p.entryAt(ctx, p.lower, rel)
	if err != nil {
		return fmt.Errorf("the base's directory: %w", err)
	}
	a.stats.Entries++
	if err := setMeta(metaTarget{fd: fd}, &want); err != nil {
		return err
	}
	res.BaseCopies = append(res.BaseCopies, rel)
	return nil
}

// verifyBaseDir checks that the upper's directory rel reads back as the
// lower's (its metadata) and holds only names the lower holds, each its
// copy.
func (p *DiffPlan) verifyBaseDir(ctx context.Context, rel string, depth int) error {
	if depth > delta.MaxDepth {
		return delta.CorruptAt(rel, "directories nested more than %d deep", delta.MaxDepth)
	}
	want, err := p.entryAt(ctx, p.lower, rel)
	if err != nil {
		return fmt.Errorf("the base's directory: %w", err)
	}
	got, err := p.entryAt(ctx, p.root, rel)
	if err != nil {
		return err
	}
	got.Subtree = want.Subtree // the names below are checked one by one
	if !sameEntry(&got, &want) {
		return fmt.Errorf("reads back as %s mode %o, the base's is %s mode %o: %w", got.Type, got.Mode, want.Type, want.Mode, errdefs.ErrCorrupt)
	}
	rootFD, err := fsat.OpenDir(p.root)
	if err != nil {
		return err
	}
	defer unix.Close(rootFD)
	fd, err := fsat.Open(rootFD, rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	names, err := fsat.ReadDirNames(fd)
	unix.Close(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		crel := path.Join(rel, n)
		var err error
		if got, gerr := p.entryAt(ctx, p.root, crel); gerr != nil {
			err = gerr
		} else if got.Type == delta.TypeDir {
			err = p.verifyBaseDir(ctx, crel, depth+1)
		} else {
			err = p.verifyBaseCopy(ctx, crel)
		}
		if err != nil {
			return fmt.Errorf("/%s: %w", crel, err)
		}
	}
	return nil
}

// mergeDir writes the target's directory e (at rel) into the merged
// directory name (in dirFD, the mount) the base (lowerFD) shows there:
// names the base lacks are created, base names replaced (unlinked, then
// created; a whiteout is the unlink alone), base directories merged the
// same way, and the directory's metadata set last, which has overlay copy
// it up if no name below did.
func (p *DiffPlan) mergeDir(ctx context.Context, a *applier, lowerFD, dirFD int, name, rel string, e *delta.Entry, depth int) error {
	kids, err := baseChildren(ctx, p, lowerFD, rel, e, depth)
	if err != nil {
		return err
	}
	fd, err := fsat.Open(dirFD, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	for _, k := range kids {
		ce, crel, b := k.e, k.rel, k.b
		if b.present && ce.Type == delta.TypeDir {
			if err := p.mergeDir(ctx, a, lowerFD, fd, ce.Name, crel, ce, depth+1); err != nil {
				return err
			}
			continue
		}
		if b.present {
			if err := ignoreENOENT(unix.Unlinkat(fd, ce.Name, 0)); err != nil {
				return err
			}
			if ce.Type == delta.TypeWhiteout {
				continue
			}
		}
		if ce.Type == delta.TypeFile {
			a.files[crel] = true
		}
		if err := a.entry(ctx, fd, crel, ce); err != nil {
			return err
		}
	}
	a.stats.Entries++
	return setMeta(metaTarget{fd: fd}, e)
}
