package btrfs

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"slices"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// dirResult is one directory's layer tree and state key.
type dirResult struct {
	id, key delta.ID
	empty   bool
}

// dir derives the layer tree of directory rel (inode ino) of the snapshot.
// full says it is listed in full rather than merged with the base; prev is
// its record from the previous state, if it was in the layer.
func (w *walker) dir(rel string, full bool, ino uint64, it inodeItem, prev *record) (dirResult, error) {
	if err := w.ctx.Err(); err != nil {
		return dirResult{}, err
	}
	w.stats.Dirs++
	var prevTree *delta.Tree
	if prev != nil {
		var err error
		if prevTree, err = prev.tree(); err != nil {
			return dirResult{}, fmt.Errorf("%w: %v", errStale, err)
		}
		if prev.Path != rel {
			w.p.moved = append(w.p.moved, prev.Path)
		}
	} else {
		prevTree = &delta.Tree{}
	}
	// A directory listed in full whose listing is not known, or one that
	// moved or changed kind, is looked at entry by entry; otherwise only its
	// dirty names are, and the rest of its layer entries carry over.
	fresh := (prev == nil && full) || (prev != nil && (prev.Path != rel || prev.Full != full))
	relist := fresh || w.dirty[rel]
	var names []string
	inSnap := map[string]bool{}
	if relist {
		ns, err := listAt(w.snapFD, rel)
		if err != nil {
			return dirResult{}, fmt.Errorf("scan %s: %w", w.where(rel), err)
		}
		for _, n := range ns {
			inSnap[n] = true
		}
		names = ns
		if !full {
			bs, err := listAt(w.baseFD, rel)
			if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) && !errors.Is(err, unix.ELOOP) {
				return dirResult{}, fmt.Errorf("base %s: %w", rel, err)
			}
			names = append(names, bs...)
		}
	} else {
		for _, e := range prevTree.Entries {
			names = append(names, e.Name)
		}
		for n := range w.kids[rel] {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)

	t := &delta.Tree{Entries: make([]delta.Entry, 0, len(names))}
	st := &delta.Tree{Entries: make([]delta.Entry, 0, len(names))}
	kids := map[string]kid{}
	var lists []delta.ChunkListBlob
	for _, name := range names {
		crel := path.Join(rel, name)
		pe := prevTree.Find(name)
		var e *delta.Entry
		var k kid
		switch {
		case relist && !inSnap[name]:
			e = &delta.Entry{Name: name, Type: delta.TypeWhiteout}
		case !relist && pe != nil && pe.Type == delta.TypeWhiteout:
			e = pe
		case fresh || w.dirty[crel] || w.onPath[crel] || (full && pe == nil):
			var err error
			if e, k, err = w.child(crel, name, full, pe, prev); err != nil {
				return dirResult{}, err
			}
		case pe != nil:
			e = pe // unchanged since the previous state
			if pe.Type == delta.TypeDir {
				k = prev.Kids[name]
				w.p.alive[recKey{k.Ino, k.Gen}] = true
			}
		}
		if e == nil {
			continue
		}
		if l, ok := e.MakeIndirect(w.ids); ok {
			lists = append(lists, l)
		}
		t.Entries = append(t.Entries, *e)
		se := *e
		if se.Type == delta.TypeDir {
			kids[name] = k
			if k.Residue {
				continue
			}
			se.MtimeNs, se.Subtree = 0, k.Key
		}
		st.Entries = append(st.Entries, se)
	}
	if err := t.Check(); err != nil {
		return dirResult{}, fmt.Errorf("scan %s: %w", w.where(rel), err)
	}
	data := t.Encode()
	res := dirResult{id: w.ids.Hash(data), key: w.ids.Hash(st.Encode()), empty: len(t.Entries) == 0}
	if w.saver != nil && (prev == nil || !bytes.Equal(prev.Tree, data)) {
		for _, l := range lists {
			if err := w.saveTree(l.ID, l.Data); err != nil {
				return dirResult{}, fmt.Errorf("save chunk list of %s: %w", w.where(rel), err)
			}
		}
		if err := w.saveTree(res.id, data); err != nil {
			return dirResult{}, fmt.Errorf("save tree of %s: %w", w.where(rel), err)
		}
	}
	rec := &record{Ino: ino, Gen: it.Gen, Path: rel, Full: full, Tree: data, Kids: kids, decoded: t}
	if prev == nil || !bytes.Equal(prev.encode(), rec.encode()) {
		w.p.recs[rec.key()] = rec
	}
	if prev != nil {
		for name, pk := range prev.Kids {
			if nk, ok := kids[name]; !ok || nk.Ino != pk.Ino || nk.Gen != pk.Gen {
				w.p.gone[recKey{pk.Ino, pk.Gen}] = path.Join(prev.Path, name)
			}
		}
	}
	return res, nil
}

// where names rel for errors; it is never opened as a host path.
func (w *walker) where(rel string) string { return w.snap + ":/" + rel }

// child looks at one name of a directory: parentFull says the directory is
// listed in full; pe is the name's entry in the directory's previous record.
func (w *walker) child(rel, name string, parentFull bool, pe *delta.Entry, parentPrev *record) (*delta.Entry, kid, error) {
	p := w.where(rel)
	// The snapshot is read-only, so nothing changes under the walk, but its
	// paths may be longer than a host path may be: everything below goes
	// through the parent's descriptor.
	dirFD, _, err := fsat.OpenParent(w.snapFD, rel)
	if err != nil {
		return nil, kid{}, fmt.Errorf("%w: parent of %s: %v", errStale, rel, err)
	}
	defer unix.Close(dirFD)
	var st unix.Stat_t
	if err := unix.Fstatat(dirFD, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, kid{}, fmt.Errorf("%w: %s is gone", errStale, rel)
		}
		return nil, kid{}, fmt.Errorf("scan %s: %w", p, err)
	}
	w.stats.Entries++
	if st.Dev != w.snapDev {
		return nil, kid{}, fmt.Errorf("scan %s: a nested subvolume or mount inside a sandbox is not supported", p)
	}
	it, err := w.item(st.Ino)
	if err != nil {
		return nil, kid{}, err
	}
	e, err := statEntry(name, &st)
	if err != nil {
		return nil, kid{}, fmt.Errorf("scan %s: %w", p, err)
	}
	isDir := e.Type == delta.TypeDir
	include, childFull, opaque := true, parentFull, false
	if !parentFull {
		same, exists, err := w.baseSame(rel, st.Ino, it)
		if err != nil {
			return nil, kid{}, err
		}
		touched := it.Transid > w.baseGen
		switch {
		case isDir:
			include, childFull, opaque = touched || !same, !same, !same && exists
		case !touched && same && st.Nlink > 1:
			outside, err := w.nameOutside(st.Ino)
			if err != nil {
				return nil, kid{}, err
			}
			include = outside
		default:
			include = touched || !same
		}
	}
	if !isDir && st.Nlink > 1 {
		w.p.multi[st.Ino] = true
		if err := w.expand(st.Ino); err != nil {
			return nil, kid{}, err
		}
	}
	if !include && !isDir {
		return nil, kid{}, nil
	}
	if e.Xattrs, err = readXattrs(dirFD, name, w.xbuf); err != nil {
		return nil, kid{}, fmt.Errorf("scan %s: %w", p, err)
	}
	if isDir {
		return w.subdir(rel, &e, st.Ino, it, childFull, opaque, include, pe, parentPrev)
	}
	if st.Nlink > 1 {
		w.p.emitted[st.Ino] = append(w.p.emitted[st.Ino], rel)
		// The format links regular files only (a hardlinked fifo or
		// symlink is recorded as separate entries).
		if e.Type == delta.TypeFile {
			if primary, ok := w.p.primary[st.Ino]; ok {
				return &delta.Entry{Name: name, Type: delta.TypeHardlink, Target: primary}, kid{}, nil
			}
			w.p.primary[st.Ino] = rel
		}
	}
	switch e.Type {
	case delta.TypeSymlink:
		if e.Target, err = fsat.Readlink(dirFD, name); err != nil {
			return nil, kid{}, fmt.Errorf("scan %s: %w", p, err)
		}
	case delta.TypeFile:
		c, err := w.content(dirFD, name, &st, pe)
		if err != nil {
			return nil, kid{}, err
		}
		e.SetContent(c)
	}
	return &e, kid{}, nil
}

// subdir walks a child directory; keep says it belongs in the layer even
// if nothing below it does.
func (w *walker) subdir(rel string, e *delta.Entry, ino uint64, it inodeItem, full, opaque, keep bool, pe *delta.Entry, parentPrev *record) (*delta.Entry, kid, error) {
	k := recKey{ino, it.Gen}
	prev, err := w.record(k)
	if err != nil {
		return nil, kid{}, err
	}
	if parentPrev != nil && pe != nil && pe.Type == delta.TypeDir {
		if pk := parentPrev.Kids[e.Name]; pk.Ino == ino && pk.Gen == it.Gen {
			if prev == nil || w.ids.Hash(prev.Tree) != pe.Subtree {
				return nil, kid{}, fmt.Errorf("%w: record of %s does not match its parent", errStale, rel)
			}
		}
	}
	r, err := w.dir(rel, full, ino, it, prev)
	if err != nil {
		return nil, kid{}, err
	}
	if !keep && r.empty {
		return nil, kid{}, nil // an untouched base directory with nothing changed below
	}
	w.p.alive[k] = true
	e.Subtree, e.Opaque = r.id, opaque
	residue := false
	if !full && !opaque && r.key == w.empty {
		// A merged directory that differs from the base's at most in its
		// mtime (a temp file came and went): state for the tree, but no
		// state change for classification, as overlay's copy-up residue.
		if residue, err = w.sameAsBaseDir(rel, e); err != nil {
			return nil, kid{}, err
		}
	}
	return e, kid{Ino: ino, Gen: it.Gen, Key: r.key, Residue: residue}, nil
}
