package btrfs

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// content returns a file's chunks, reading it only if it may have changed.
func (w *walker) content(dirFD int, name string, st *unix.Stat_t, pe *delta.Entry) (content, error) {
	ctime := unix.TimespecToNsec(st.Ctim)
	if r, ok := w.reads[st.Ino]; ok && r.ctime == ctime {
		return r.c, nil
	}
	if _, changed := w.changed[st.Ino]; !changed && pe != nil && pe.Type == delta.TypeFile && pe.Size == uint64(st.Size) {
		// Same name, same unchanged inode: the content is the one recorded.
		return pe.Content(), nil
	}
	if w.files == nil {
		// Past fstree.PipelineThreshold it hashes and compresses on every
		// core; the walk's trees go through it too (saveTree), in order.
		w.files = fstree.NewFileReader(w.ids, w.saver, &w.stats, 0)
	}
	c, err := readContent(w.ctx, dirFD, name, st, w.files)
	if err != nil {
		return content{}, err
	}
	w.reads[st.Ino] = readResult{ctime: ctime, c: c}
	return c, nil
}

// baseSame reports whether rel holds the base's own inode ino (same), and
// whether the base has anything at rel (exists).
func (w *walker) baseSame(rel string, ino uint64, it inodeItem) (same, exists bool, err error) {
	var bst unix.Stat_t
	if err := fsat.Lstat(w.baseFD, rel, &bst); err != nil {
		// A symlink above rel in the base (ELOOP) means the base has no
		// directory chain to rel: overlay would not merge through it either.
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			return false, false, nil
		}
		return false, false, fmt.Errorf("base %s: %w", rel, err)
	}
	return bst.Ino == ino && it.Gen <= w.baseGen, true, nil
}

// nameOutside reports whether inode ino has a name that is not at its base
// place (below a directory listed in full, or moved).
func (w *walker) nameOutside(ino uint64) (bool, error) {
	ps, err := w.inoPaths(ino)
	if err != nil {
		return false, err
	}
	for _, q := range ps {
		merged, err := w.merged(parentOf(q))
		if err != nil {
			return false, err
		}
		same, _, err := w.baseSame(q, ino, w.items[ino])
		if err != nil {
			return false, err
		}
		if !merged || !same {
			return true, nil
		}
	}
	return false, nil
}

// merged reports whether directory rel and every directory above it are at
// their base places.
func (w *walker) merged(rel string) (bool, error) {
	if rel == "" {
		return true, nil
	}
	if m, ok := w.p.mergeMemo[rel]; ok {
		return m, nil
	}
	var st unix.Stat_t
	if err := fsat.Lstat(w.snapFD, rel, &st); err != nil {
		return false, fmt.Errorf("scan %s: %w", w.where(rel), err)
	}
	it, err := w.item(st.Ino)
	if err != nil {
		return false, err
	}
	same, _, err := w.baseSame(rel, st.Ino, it)
	if err != nil {
		return false, err
	}
	m := same
	if m {
		if m, err = w.merged(parentOf(rel)); err != nil {
			return false, err
		}
	}
	w.p.mergeMemo[rel] = m
	return m, nil
}

// sameAsBaseDir reports whether the base's directory rel has e's mode,
// ownership and xattrs.
func (w *walker) sameAsBaseDir(rel string, e *delta.Entry) (bool, error) {
	fd, err := fsat.Open(w.baseFD, rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return false, nil
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, nil
	}
	if st.Mode&07777 != e.Mode || st.Uid != e.UID || st.Gid != e.GID {
		return false, nil
	}
	x, err := fsat.XattrsFD(fd, w.xbuf, func(n string) bool { return strings.HasPrefix(n, overlayXattrPrefix) })
	if err != nil {
		return false, fmt.Errorf("base %s: %w", rel, err)
	}
	return slices.EqualFunc(x, e.Xattrs, func(a, b delta.Xattr) bool {
		return a.Name == b.Name && bytes.Equal(a.Value, b.Value)
	}), nil
}

func parentOf(p string) string {
	d := path.Dir(p)
	if d == "." {
		return ""
	}
	return d
}
