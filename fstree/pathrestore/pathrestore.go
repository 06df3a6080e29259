// Package pathrestore brings single paths of a checkpoint's state back:
// into a directory (Restore: each path made exactly the state's, the rest
// left alone) or out as a file's bytes (StreamContent), and CleanPath, the
// check every user-given in-sandbox path passes first. It writes entries
// with fstree's EntryWriter, the writer Materialise uses; fstree never
// imports it.
package pathrestore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// Result is what Restore did with one path.
type Result struct {
	Path string // root-relative
	// Removed says the path does not exist in the state, so it was
	// removed from the target (Existed says whether there was anything).
	Removed bool
	Existed bool
	Stats   fstree.ApplyStats // what was written
	Kept    int64             // entries that already were as in the state, left alone
}

// CleanPath turns a user's in-sandbox path ("/etc/app.conf", "src/") into
// the root-relative form of trees ("etc/app.conf"; "" is the root). It
// refuses what could name something outside the root or is not a path a
// tree can hold: ".." and "." components, NUL bytes, over-long names.
func CleanPath(p string) (string, error) {
	rel := strings.Trim(p, "/")
	for strings.Contains(rel, "//") {
		rel = strings.ReplaceAll(rel, "//", "/")
	}
	if rel == "" {
		return "", nil
	}
	if !delta.ValidPath(rel) {
		return "", fmt.Errorf("path %q: not a clean in-sandbox path (no \"..\" or \".\" components, no NUL, names up to %d bytes): %w",
			p, delta.MaxEntryName, errdefs.ErrInvalid)
	}
	return rel, nil
}

// Restore makes each root-relative path below the directory dstFD
// exactly what it is in the state l (base first, overlay semantics), and
// leaves everything else alone. A path absent in l is removed from dst.
// Directories are restored whole: what dst holds below them and l does not
// is removed. Missing parent directories are created with l's metadata.
//
// What already equals the state (type, metadata, xattrs and, for files,
// every chunk's hash) is left as it is, and a directory that exists on both
// sides is synchronised in place; everything else is built under a
// temporary name beside it (chunks verified as they are read) and renamed
// over the old name when complete, so a damaged chunk leaves that entry as
// it was and no entry is ever half written.
//
// Safety is fstree's EntryWriter's: every name is reached from dstFD with
// openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, so a symlink in dst on the
// way to a path is an error (ErrPrecondition), never followed, and a
// symlink at the path itself is replaced, not written through. Device
// nodes follow CheckDevice unless opts.AllowDevices. A hardlink whose
// primary this call restored (or found equal) stays a hardlink; one whose
// primary is elsewhere becomes a copy of it. paths must be clean
// (CleanPath) and not empty; nested ones are covered by their ancestor.
func Restore(ctx context.Context, l delta.Layers, dstFD int, paths []string, opts fstree.ApplyOptions) ([]Result, error) {
	paths = coverPaths(paths)
	r := &pathRestorer{w: fstree.NewEntryWriter(dstFD, opts), opts: opts, rootFD: dstFD, state: l, loc: map[string]string{}}
	var out []Result
	for _, p := range paths {
		if p == "" {
			return out, fmt.Errorf("restore of the whole root: use rollback: %w", errdefs.ErrInvalid)
		}
		*r.w.Stats(), r.kept = fstree.ApplyStats{}, 0
		res, err := r.one(ctx, p)
		if err != nil {
			return out, fmt.Errorf("restore /%s: %w", p, err)
		}
		res.Stats, res.Kept = *r.w.Stats(), r.kept
		out = append(out, res)
	}
	return out, nil
}

// coverPaths sorts paths and drops those below another one.
func coverPaths(paths []string) []string {
	s := slices.Clone(paths)
	slices.Sort(s)
	s = slices.Compact(s)
	var out []string
	for _, p := range s {
		if len(out) > 0 {
			last := out[len(out)-1]
			if last == "" || strings.HasPrefix(p, last+"/") {
				continue
			}
		}
		out = append(out, p)
	}
	return out
}

type pathRestorer struct {
	w      *fstree.EntryWriter
	opts   fstree.ApplyOptions
	rootFD int
	state  delta.Layers
	kept   int64 // entries already as in the state, left alone
	xbuf   []byte
	// loc maps each restored top path to where it is now relative to
	// rootFD (its temporary name until renamed), for hardlinks into it.
	loc map[string]string
}

func (r *pathRestorer) one(ctx context.Context, p string) (Result, error) {
	res := Result{Path: p}
	e, sub, ok, err := delta.LookupDir(ctx, r.opts.Loader, r.state, p)
	if err != nil {
		return res, err
	}
	resolved(&e)
	dir, name := path.Split(p)
	dir = strings.TrimSuffix(dir, "/")
	parentFD, made, err := r.parent(ctx, dir, ok)
	if err != nil || parentFD < 0 {
		return res, err // absent on both sides: nothing to do
	}
	defer unix.Close(parentFD)
	var st unix.Stat_t
	res.Existed = unix.Fstatat(parentFD, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
	if !ok {
		res.Removed = true
		if res.Existed {
			err = fstree.RemoveAt(parentFD, name)
		}
		return res, err
	}
	if err := r.put(ctx, parentFD, p, &e, sub, res.Existed, &st); err != nil {
		return res, err
	}
	// Directories this call made on the way get their own metadata last,
	// deepest first, so their mtimes are the state's.
	for i := len(made) - 1; i >= 0; i-- {
		if err := r.setDirMeta(ctx, made[i]); err != nil {
			return res, err
		}
	}
	return res, nil
}

// put makes the name e.Name in dirFD (path rel) what e is. A directory
// that is a directory on both sides is synchronised in place (sync); an
// entry already equal to e (same) is left alone, so processes holding it
// and file watchers see only what really changes, and an overlay root does
// not copy up what it need not. Anything else is built under a temporary
// name and renamed over the old one.
func (r *pathRestorer) put(ctx context.Context, dirFD int, rel string, e *delta.Entry, sub delta.Layers, exists bool, st *unix.Stat_t) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := delta.CheckEntry(e, true); err != nil {
		return err
	}
	isDir := exists && st.Mode&unix.S_IFMT == unix.S_IFDIR
	if e.Type == delta.TypeDir && isDir {
		fd, err := fsat.Open(dirFD, e.Name, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return r.sync(ctx, fd, rel, e, sub)
	}
	if exists {
		same, err := r.same(ctx, dirFD, e, st)
		if err != nil {
			return err
		}
		if same {
			r.kept++
			if e.Type == delta.TypeFile {
				r.w.NoteFile(rel)
			}
			return nil
		}
	}
	tmp := ".turnsnap-restore-" + randomHex()
	r.loc[rel] = path.Join(path.Dir(rel), tmp)
	defer delete(r.loc, rel)
	built := *e
	built.Name = tmp
	if err := r.build(ctx, dirFD, rel, &built, sub); err != nil {
		fstree.RemoveAt(dirFD, tmp)
		return err
	}
	// Only a directory (old or new) needs the old name gone first: rename
	// replaces anything else atomically.
	if exists && (isDir || e.Type == delta.TypeDir) {
		if err := fstree.RemoveAt(dirFD, e.Name); err != nil {
			fstree.RemoveAt(dirFD, tmp)
			return err
		}
	}
	if err := unix.Renameat(dirFD, tmp, dirFD, e.Name); err != nil {
		fstree.RemoveAt(dirFD, tmp)
		return fmt.Errorf("rename into place: %w", err)
	}
	return nil
}

// sync makes the existing directory fd (path rel) hold exactly the merged
// entries of sub: names it has beyond them are removed, the others put.
func (r *pathRestorer) sync(ctx context.Context, fd int, rel string, e *delta.Entry, sub delta.Layers) error {
	entries, subs, err := r.list(ctx, sub)
	if err != nil {
		return err
	}
	names, err := fsat.ReadDirNames(fd)
	if err != nil {
		return err
	}
	want := make(map[string]bool, len(entries))
	for i := range entries {
		want[entries[i].Name] = true
	}
	for _, n := range names {
		if !want[n] {
			if err := fstree.RemoveAt(fd, n); err != nil {
				return fmt.Errorf("remove /%s: %w", path.Join(rel, n), err)
			}
		}
	}
	for i := range entries {
		c := &entries[i]
		crel := path.Join(rel, c.Name)
		var st unix.Stat_t
		exists := unix.Fstatat(fd, c.Name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
		if err := r.put(ctx, fd, crel, c, subs[i], exists, &st); err != nil {
			return fmt.Errorf("/%s: %w", crel, err)
		}
	}
	return fstree.SetFileMeta(fd, e)
}

// list is ListDir of a merged directory, each entry resolved.
func (r *pathRestorer) list(ctx context.Context, sub delta.Layers) ([]delta.Entry, []delta.Layers, error) {
	entries, subs, err := delta.ListDir(ctx, r.opts.Loader, sub)
	for i := range entries {
		resolved(&entries[i])
	}
	return entries, subs, err
}

// resolved clears a merged entry's opaque marker. In a layer the marker
// says "hide the directory below"; a merged listing has already obeyed it
// (the entry's Layers are its own subtree alone), so what a path restore
// writes, the merged view into a plain directory, has no marker to carry.
// Overlay marks every directory the sandbox makes under a merged one, so
// a healthy checkpoint is full of them; refusing them as entries outside
// a writable layer (CheckEntry) called such checkpoints corrupt. On an
// overlay root the kernel marks what is made through the mount itself.
func resolved(e *delta.Entry) {
	if e.Type == delta.TypeDir {
		e.Opaque = false
	}
}

// errDiffers stops comparing a file's content at its first differing chunk.
var errDiffers = errors.New("content differs")

// same reports whether the existing name e.Name in dirFD (stat st) is
// already exactly e: type, mode, owner, mtime, xattrs, target, device
// number and, for a file, every chunk's hash (the file is read). A
// multiply-linked file is never the same: its other names would change
// with it. Hardlink entries are always made anew.
func (r *pathRestorer) same(ctx context.Context, dirFD int, e *delta.Entry, st *unix.Stat_t) (bool, error) {
	kinds := map[delta.Type]uint32{delta.TypeFile: unix.S_IFREG, delta.TypeSymlink: unix.S_IFLNK, delta.TypeFIFO: unix.S_IFIFO,
		delta.TypeSocket: unix.S_IFSOCK, delta.TypeCharDev: unix.S_IFCHR, delta.TypeBlockDev: unix.S_IFBLK}
	kind, ok := kinds[e.Type]
	if !ok || st.Mode&unix.S_IFMT != kind || st.Mode&delta.ModeMask != e.Mode || st.Uid != e.UID || st.Gid != e.GID ||
		unix.TimespecToNsec(st.Mtim) != e.MtimeNs || (e.Type == delta.TypeFile && (st.Nlink != 1 || uint64(st.Size) != e.Size)) {
		return false, nil
	}
	if (e.Type == delta.TypeCharDev || e.Type == delta.TypeBlockDev) && st.Rdev != e.Rdev {
		return false, nil
	}
	if r.xbuf == nil {
		r.xbuf = make([]byte, fsat.XattrBufSize)
	}
	xs, err := fsat.Xattrs(dirFD, e.Name, r.xbuf, func(n string) bool { return strings.HasPrefix(n, delta.OverlayXattrPrefix) })
	if err != nil || !slices.EqualFunc(xs, e.Xattrs, func(a, b delta.Xattr) bool { return a.Name == b.Name && string(a.Value) == string(b.Value) }) {
		return false, nil
	}
	switch e.Type {
	case delta.TypeSymlink:
		t, err := fsat.Readlink(dirFD, e.Name)
		return err == nil && t == e.Target, nil
	case delta.TypeFile:
		if !e.Resolved() {
			return false, nil // cannot compare: rewrite it
		}
		// O_PATH, then the very inode that was stat-ed reopened: whatever
		// the sandbox swaps in meanwhile (a fifo, a device) is not opened.
		pfd, err := unix.Openat(dirFD, e.Name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return false, nil
		}
		defer unix.Close(pfd)
		var now unix.Stat_t
		if err := unix.Fstat(pfd, &now); err != nil || !fsat.SameFile(&now, st) || now.Mode&unix.S_IFMT != unix.S_IFREG {
			return false, nil
		}
		f, err := os.Open("/proc/self/fd/" + strconv.Itoa(pfd))
		if err != nil {
			return false, nil
		}
		defer f.Close()
		i := 0
		err = delta.NewChunker().Chunk(f, st.Size, func(data []byte) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			if i >= len(e.Chunks) || r.opts.IDs.Hash(data) != e.Chunks[i] {
				return errDiffers
			}
			i++
			return nil
		})
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		return err == nil && i == len(e.Chunks), nil
	}
	return true, nil
}

// parent opens directory rel below rootFD. A component that is missing is
// created when create is set (and listed in made, to get its metadata
// later); otherwise parent returns -1 and nothing. A component that exists
// but is not a directory is an error: it is not this path to replace.
func (r *pathRestorer) parent(ctx context.Context, rel string, create bool) (fd int, made []string, err error) {
	cur, err := unix.Dup(r.rootFD)
	if err != nil {
		return -1, nil, err
	}
	if rel == "" {
		return cur, nil, nil
	}
	done := ""
	for _, c := range strings.Split(rel, "/") {
		done = path.Join(done, c)
		var st unix.Stat_t
		err := unix.Fstatat(cur, c, &st, unix.AT_SYMLINK_NOFOLLOW)
		switch {
		case errors.Is(err, unix.ENOENT):
			if !create {
				unix.Close(cur)
				return -1, nil, nil
			}
			if err := unix.Mkdirat(cur, c, 0o700); err != nil {
				unix.Close(cur)
				return -1, nil, err
			}
			made = append(made, done)
		case err != nil:
			unix.Close(cur)
			return -1, nil, err
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			unix.Close(cur)
			return -1, nil, fmt.Errorf("/%s in the target is a %s, not a directory (restore /%s itself to replace it): %w",
				done, fileKind(st.Mode), done, errdefs.ErrPrecondition)
		}
		next, err := fsat.Open(cur, c, unix.O_RDONLY|unix.O_DIRECTORY)
		unix.Close(cur)
		if err != nil {
			return -1, nil, fmt.Errorf("/%s: %w", done, err)
		}
		cur = next
	}
	return cur, made, nil
}

func (r *pathRestorer) setDirMeta(ctx context.Context, rel string) error {
	e, _, ok, err := delta.LookupDir(ctx, r.opts.Loader, r.state, rel)
	if err != nil || !ok {
		return err
	}
	fd, err := fsat.Open(r.rootFD, rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("/%s: %w", rel, err)
	}
	defer unix.Close(fd)
	return fstree.SetFileMeta(fd, &e)
}

// build creates e (named e.Name in dirFD) with everything below it; rel is
// its path in the state.
func (r *pathRestorer) build(ctx context.Context, dirFD int, rel string, e *delta.Entry, sub delta.Layers) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	switch e.Type {
	case delta.TypeDir:
		r.w.Stats().Entries++
		if err := unix.Mkdirat(dirFD, e.Name, 0o700); err != nil {
			return err
		}
		fd, err := fsat.Open(dirFD, e.Name, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		entries, subs, err := r.list(ctx, sub)
		if err != nil {
			return fmt.Errorf("/%s: %w", rel, err)
		}
		for i := range entries {
			c := &entries[i]
			crel := path.Join(rel, c.Name)
			if err := delta.CheckEntry(c, true); err != nil {
				return fmt.Errorf("/%s: %w", crel, err)
			}
			if err := r.build(ctx, fd, crel, c, subs[i]); err != nil {
				return fmt.Errorf("/%s: %w", crel, err)
			}
		}
		return fstree.SetFileMeta(fd, e)
	case delta.TypeHardlink:
		return r.link(ctx, dirFD, rel, e)
	case delta.TypeWhiteout:
		return fmt.Errorf("whiteout in a merged state: %w", errdefs.ErrCorrupt)
	}
	return r.w.Write(ctx, dirFD, rel, e)
}

// link makes a hardlink to its primary where this call restored it, and
// a copy of the primary otherwise (its other names are not this restore's).
func (r *pathRestorer) link(ctx context.Context, dirFD int, rel string, e *delta.Entry) error {
	if r.w.Wrote(e.Target) {
		r.w.Stats().Entries++
		tfd, err := fsat.Open(r.rootFD, r.where(e.Target), unix.O_PATH)
		if err != nil {
			return fmt.Errorf("hardlink target %s: %w", e.Target, err)
		}
		defer unix.Close(tfd)
		return unix.Linkat(tfd, "", dirFD, e.Name, unix.AT_EMPTY_PATH)
	}
	primary, ok, err := delta.Lookup(ctx, r.opts.Loader, r.state, e.Target)
	if err != nil {
		return err
	}
	if !ok || primary.Type != delta.TypeFile {
		return fmt.Errorf("hardlink to %q, which is not a file of the checkpoint: %w", e.Target, errdefs.ErrCorrupt)
	}
	primary.Name = e.Name
	return r.w.Write(ctx, dirFD, rel, &primary)
}

// where is the current location of the restored path rel below rootFD.
func (r *pathRestorer) where(rel string) string {
	for top, at := range r.loc {
		if rel == top {
			return at
		}
		if strings.HasPrefix(rel, top+"/") {
			return at + rel[len(top):]
		}
	}
	return rel
}

func fileKind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "directory"
	}
	return "special file"
}

func randomHex() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// StreamContent writes a file entry's content to w front to back (zeros
// for its holes), each chunk verified by the loader as it is read, and
// checks the chunks add up to the entry's data size. It returns the bytes
// written. On an error w may hold a prefix of the content: the caller must
// not present it as the file. (Restores write files with WriteContent,
// which keeps holes as holes.)
func StreamContent(ctx context.Context, loader delta.BlobLoader, w io.Writer, e *delta.Entry) (uint64, error) {
	if e.Type != delta.TypeFile {
		return 0, fmt.Errorf("%s is a %s, not a file: %w", e.Name, e.Type, errdefs.ErrInvalid)
	}
	var zero [64 << 10]byte
	var pos, n uint64
	pad := func(upto uint64) error { // zeros from pos to upto: a hole
		for pos < upto {
			k := min(upto-pos, uint64(len(zero)))
			if _, err := w.Write(zero[:k]); err != nil {
				return err
			}
			pos += k
		}
		return nil
	}
	chunks, err := delta.LoadChunks(ctx, loader, e)
	if err != nil {
		return 0, err
	}
	runs := delta.DataRuns(e.Size, e.Holes)
	for _, c := range chunks {
		if n > e.DataSize() {
			break // already more than declared: CheckFileSize says so
		}
		data, err := loader.LoadBlob(ctx, delta.BlobData, c)
		if err != nil {
			return pos, fmt.Errorf("chunk %s: %w", c.Short(), err)
		}
		n += uint64(len(data))
		for len(data) > 0 && len(runs) > 0 {
			if err := pad(runs[0].Off); err != nil {
				return pos, err
			}
			k := min(uint64(len(data)), runs[0].Len)
			if _, err := w.Write(data[:k]); err != nil {
				return pos, err
			}
			pos += k
			data = data[k:]
			runs[0].Off += k
			if runs[0].Len -= k; runs[0].Len == 0 {
				runs = runs[1:]
			}
		}
	}
	if err := delta.CheckFileSize(e, n); err != nil {
		return pos, err
	}
	return pos, pad(e.Size)
}
