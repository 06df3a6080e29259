package delta

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"slices"
	"strings"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// PathRestore is what RestorePaths did with one path.
type PathRestore struct {
	Path string // root-relative
	// Removed says the path does not exist in the state, so it was
	// removed from the target (Existed says whether there was anything).
	Removed bool
	Existed bool
	Stats   ApplyStats
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
	if !ValidPath(rel) {
		return "", fmt.Errorf("path %q: not a clean in-sandbox path (no \"..\" or \".\" components, no NUL, names up to %d bytes): %w",
			p, maxName, errdefs.ErrInvalid)
	}
	return rel, nil
}

// RestorePaths makes each root-relative path below the directory dstFD
// exactly what it is in the state l (base first, overlay semantics), and
// leaves everything else alone. A path absent in l is removed from dst.
// Directories are restored whole: what dst holds below them and l does not
// is gone. Missing parent directories are created with l's metadata.
//
// Safety is the applier's (apply.go): every name is reached from dstFD with
// openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, so a symlink in dst on the
// way to a path is an error (ErrPrecondition), never followed, and a
// symlink at the path itself is replaced, not written through. Device
// nodes follow CheckDevice unless opts.AllowDevices. Each path is built
// under a temporary name beside it (chunks verified as they are read) and
// renamed into place only when complete, so a corrupt chunk leaves that
// path as it was. A hardlink whose primary is in an earlier restored path
// stays a hardlink; one whose primary is elsewhere becomes a copy of it.
// paths must be clean (CleanPath) and not empty; nested ones are covered
// by their ancestor.
func RestorePaths(ctx context.Context, l Layers, dstFD int, paths []string, opts ApplyOptions) ([]PathRestore, error) {
	paths = coverPaths(paths)
	r := &pathRestorer{
		applier: applier{opts: opts, rootFD: dstFD, merge: false, files: map[string]bool{},
			budget: Footprint{Entries: math.MaxUint64}},
		state: l, loc: map[string]string{},
	}
	var out []PathRestore
	for _, p := range paths {
		if p == "" {
			return out, fmt.Errorf("restore of the whole root: use rollback: %w", errdefs.ErrInvalid)
		}
		r.stats = ApplyStats{}
		res, err := r.one(ctx, p)
		if err != nil {
			return out, fmt.Errorf("restore /%s: %w", p, err)
		}
		res.Stats = r.stats
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
	applier
	state Layers
	// loc maps each restored top path to where it is now relative to
	// rootFD (its temporary name until renamed), for hardlinks into it.
	loc map[string]string
}

func (r *pathRestorer) one(ctx context.Context, p string) (PathRestore, error) {
	res := PathRestore{Path: p}
	e, sub, ok, err := LookupDir(ctx, r.opts.Loader, r.state, p)
	if err != nil {
		return res, err
	}
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
			err = removeAt(parentFD, name)
		}
		return res, err
	}
	if err := CheckEntry(&e, true); err != nil {
		return res, err
	}
	tmp := ".turnsnap-restore-" + randomHex()
	r.loc[p] = path.Join(dir, tmp)
	built := e
	built.Name = tmp
	if err := r.build(ctx, parentFD, p, &built, sub); err != nil {
		removeAt(parentFD, tmp)
		return res, err
	}
	// Only a directory, or a name that is one, needs the old name gone
	// first: rename replaces anything else atomically.
	if res.Existed && (e.Type == TypeDir || st.Mode&unix.S_IFMT == unix.S_IFDIR) {
		if err := removeAt(parentFD, name); err != nil {
			removeAt(parentFD, tmp)
			return res, err
		}
	}
	if err := unix.Renameat(parentFD, tmp, parentFD, name); err != nil {
		removeAt(parentFD, tmp)
		return res, fmt.Errorf("rename into place: %w", err)
	}
	r.loc[p] = p
	// Directories this call made on the way get their own metadata last,
	// deepest first, so their mtimes are the state's.
	for i := len(made) - 1; i >= 0; i-- {
		if err := r.setDirMeta(ctx, made[i]); err != nil {
			return res, err
		}
	}
	return res, nil
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
	e, _, ok, err := LookupDir(ctx, r.opts.Loader, r.state, rel)
	if err != nil || !ok {
		return err
	}
	fd, err := fsat.Open(r.rootFD, rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("/%s: %w", rel, err)
	}
	defer unix.Close(fd)
	return setMeta(metaTarget{fd: fd}, &e)
}

// build creates e (named e.Name in dirFD) with everything below it; rel is
// its path in the state.
func (r *pathRestorer) build(ctx context.Context, dirFD int, rel string, e *Entry, sub Layers) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	switch e.Type {
	case TypeDir:
		r.stats.Entries++
		if err := unix.Mkdirat(dirFD, e.Name, 0o700); err != nil {
			return err
		}
		fd, err := fsat.Open(dirFD, e.Name, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		entries, subs, err := ListDir(ctx, r.opts.Loader, sub)
		if err != nil {
			return fmt.Errorf("/%s: %w", rel, err)
		}
		for i := range entries {
			c := &entries[i]
			crel := path.Join(rel, c.Name)
			if err := CheckEntry(c, true); err != nil {
				return fmt.Errorf("/%s: %w", crel, err)
			}
			if err := r.build(ctx, fd, crel, c, subs[i]); err != nil {
				return fmt.Errorf("/%s: %w", crel, err)
			}
		}
		return setMeta(metaTarget{fd: fd}, e)
	case TypeHardlink:
		return r.link(ctx, dirFD, rel, e)
	case TypeWhiteout:
		return fmt.Errorf("whiteout in a merged state: %w", errdefs.ErrCorrupt)
	}
	return r.entry(ctx, dirFD, rel, e)
}

// link makes a hardlink to its primary where this call restored it, and
// a copy of the primary otherwise (its other names are not this restore's).
func (r *pathRestorer) link(ctx context.Context, dirFD int, rel string, e *Entry) error {
	if r.files[e.Target] {
		r.stats.Entries++
		tfd, err := fsat.Open(r.rootFD, r.where(e.Target), unix.O_PATH)
		if err != nil {
			return fmt.Errorf("hardlink target %s: %w", e.Target, err)
		}
		defer unix.Close(tfd)
		return unix.Linkat(tfd, "", dirFD, e.Name, unix.AT_EMPTY_PATH)
	}
	primary, ok, err := Lookup(ctx, r.opts.Loader, r.state, e.Target)
	if err != nil {
		return err
	}
	if !ok || primary.Type != TypeFile {
		return fmt.Errorf("hardlink to %q, which is not a file of the checkpoint: %w", e.Target, errdefs.ErrCorrupt)
	}
	primary.Name = e.Name
	return r.entry(ctx, dirFD, rel, &primary)
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

// WriteContent writes a file entry's content to w, each chunk verified by
// the loader as it is read, and checks it adds up to the entry's size. On
// an error w may hold a prefix of the content: the caller must not present
// it as the file.
func WriteContent(ctx context.Context, loader BlobLoader, w io.Writer, e *Entry) (uint64, error) {
	if e.Type != TypeFile {
		return 0, fmt.Errorf("%s is a %s, not a file: %w", e.Name, e.Type, errdefs.ErrInvalid)
	}
	return writeChunks(ctx, loader, w, e)
}
