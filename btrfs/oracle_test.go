package btrfs

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"golang.org/x/sys/unix"
)

// fullWalk is the reference the incremental scan is checked against: it
// derives the layer of subvolume snap against base from scratch, by the
// rules in walk.go, looking at every inode and every path of both trees.
// It shares no change-detection code with the walker: no records, no
// changed-inode search, no dirty sets.
type fullWalk struct {
	t       testing.TB
	snap    string
	base    string
	baseGen uint64
	items   map[uint64]inodeItem
	paths   map[uint64][]string
	merged  map[string]bool
	primary map[uint64]string
	trees   map[delta.ID][]byte
	xbuf    []byte
}

// oracle returns the layer tree and state key of snap and the trees made.
func oracle(t testing.TB, snap, base string, baseGen uint64) (delta.ID, delta.ID, map[delta.ID][]byte) {
	t.Helper()
	o := &fullWalk{
		t: t, snap: snap, base: base, baseGen: baseGen,
		items: map[uint64]inodeItem{}, paths: map[uint64][]string{}, merged: map[string]bool{"": true},
		primary: map[uint64]string{}, trees: map[delta.ID][]byte{}, xbuf: make([]byte, xattrBufSize),
	}
	fd, err := openDir(snap)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := changedInodes(fd, 0, func(ino uint64, it inodeItem) error { o.items[ino] = it; return nil }); err != nil {
		t.Fatal(err)
	}
	// Pass 1: every path of every inode, and which directories are merged.
	err = filepath.WalkDir(snap, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(snap, p)
		if rel == "." {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if d.IsDir() {
			o.merged[rel] = o.merged[parentOf(rel)] && o.same(rel, st.Ino)
			return nil
		}
		o.paths[st.Ino] = append(o.paths[st.Ino], rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	id, key, _ := o.dir("", false)
	return id, key, o.trees
}

func (o *fullWalk) same(rel string, ino uint64) bool {
	var bst unix.Stat_t
	return unix.Lstat(filepath.Join(o.base, rel), &bst) == nil && bst.Ino == ino && o.items[ino].Gen <= o.baseGen
}

// inLayer says whether a non-directory inode belongs in the layer.
func (o *fullWalk) inLayer(ino uint64) bool {
	if o.items[ino].Transid > o.baseGen {
		return true
	}
	for _, q := range o.paths[ino] {
		if !o.merged[parentOf(q)] || !o.same(q, ino) {
			return true
		}
	}
	return false
}

func (o *fullWalk) dir(rel string, full bool) (delta.ID, delta.ID, bool) {
	t := o.t
	names, err := readNames(filepath.Join(o.snap, rel))
	if err != nil {
		t.Fatal(err)
	}
	inSnap := map[string]bool{}
	for _, n := range names {
		inSnap[n] = true
	}
	if !full {
		bn, _ := readNames(filepath.Join(o.base, rel))
		names = append(names, bn...)
	}
	slices.Sort(names)
	tr, st := &delta.Tree{}, &delta.Tree{}
	for _, name := range slices.Compact(names) {
		crel := path.Join(rel, name)
		if !inSnap[name] {
			e := delta.Entry{Name: name, Type: delta.TypeWhiteout}
			tr.Entries, st.Entries = append(tr.Entries, e), append(st.Entries, e)
			continue
		}
		p := filepath.Join(o.snap, crel)
		var s unix.Stat_t
		if err := unix.Lstat(p, &s); err != nil {
			t.Fatal(err)
		}
		e, err := statEntry(name, &s)
		if err != nil {
			t.Fatal(err)
		}
		if e.Xattrs, err = pathXattrs(o.t, p, o.xbuf); err != nil {
			t.Fatal(err)
		}
		if e.Type == delta.TypeDir {
			same := !full && o.same(crel, s.Ino)
			id, key, empty := o.dir(crel, !same)
			touched := o.items[s.Ino].Transid > o.baseGen
			if same && !touched && empty {
				continue
			}
			e.Subtree = id
			if !full && !same {
				var bst unix.Stat_t
				e.Opaque = unix.Lstat(filepath.Join(o.base, crel), &bst) == nil
			}
			tr.Entries = append(tr.Entries, e)
			if same && key == delta.EmptyTree() && o.baseDirMeta(crel, &e) {
				continue // residue
			}
			se := e
			se.MtimeNs, se.Subtree = 0, key
			st.Entries = append(st.Entries, se)
			continue
		}
		if !full && !o.inLayer(s.Ino) {
			continue
		}
		if e.Type == delta.TypeFile && s.Nlink > 1 {
			if prim, ok := o.primary[s.Ino]; ok {
				e = delta.Entry{Name: name, Type: delta.TypeHardlink, Target: prim}
				tr.Entries, st.Entries = append(tr.Entries, e), append(st.Entries, e)
				continue
			}
			o.primary[s.Ino] = crel
		}
		switch e.Type {
		case delta.TypeFile:
			var stats fstree.ScanStats
			c, err := pathContent(o.t, p, s.Size, &stats)
			if err != nil {
				t.Fatal(err)
			}
			e.Size, e.Chunks = c.Size, c.Chunks
		case delta.TypeSymlink:
			if e.Target, err = os.Readlink(p); err != nil {
				t.Fatal(err)
			}
		}
		tr.Entries, st.Entries = append(tr.Entries, e), append(st.Entries, e)
	}
	if err := tr.Check(); err != nil {
		t.Fatalf("oracle tree of %s: %v", rel, err)
	}
	data := tr.Encode()
	id := delta.Hash(data)
	o.trees[id] = data
	return id, delta.Hash(st.Encode()), len(tr.Entries) == 0
}

func (o *fullWalk) baseDirMeta(rel string, e *delta.Entry) bool {
	p := filepath.Join(o.base, rel)
	var st unix.Stat_t
	if unix.Lstat(p, &st) != nil || st.Mode&07777 != e.Mode || st.Uid != e.UID || st.Gid != e.GID {
		return false
	}
	x, err := pathXattrs(o.t, p, o.xbuf)
	if err != nil {
		o.t.Fatal(err)
	}
	return slices.EqualFunc(x, e.Xattrs, func(a, b delta.Xattr) bool { return a.Name == b.Name && bytes.Equal(a.Value, b.Value) })
}

// pathXattrs and pathContent are the oracle's path-based views of the
// walker's descriptor-based helpers (the oracle's paths are short).
func pathXattrs(t testing.TB, p string, buf []byte) ([]delta.Xattr, error) {
	fd, err := openDir(filepath.Dir(p))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	return readXattrs(fd, filepath.Base(p), buf)
}

func pathContent(t testing.TB, p string, size int64, stats *fstree.ScanStats) (content, error) {
	fd, err := openDir(filepath.Dir(p))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstatat(fd, filepath.Base(p), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return content{}, err
	}
	st.Size = size
	return readContent(context.Background(), fd, filepath.Base(p), &st, fstree.NewFileReader(delta.IDs{}, nil, stats, 1))
}
