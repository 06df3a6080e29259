package btrfs

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

// The writable layer of a btrfs root, in the overlay upper form every
// backend records (docs/BTRFS.md, "Change detection"), is defined by inode
// identity against the base subvolume B, whose inodes the live subvolume
// inherits with their numbers:
//
//   - an inode is touched when its item changed after B was frozen (its
//     transid is above B's generation): any write, metadata change, link,
//     unlink or rename touches it, as any of them makes overlayfs copy up;
//   - a name is at its base place when B has the same inode under the same
//     path and every directory above it is at its base place too (merged);
//   - in a merged directory, a non-directory is in the layer when its inode
//     is touched, is not at its base place, or has another name that is not
//     (so every name of a hardlinked inode is in the layer or none is); a
//     base name gone from the directory is a whiteout; a directory at its
//     base place is merged (in the layer if touched or if anything below it
//     is), any other directory is listed in full, opaque if B has the name;
//   - in a directory listed in full, everything is in the layer.
//
// This depends only on the subvolume's current state, so a full walk and
// the incremental walk below must agree exactly; a randomised test checks it.

// errStale reports scan records that do not match the snapshot; the caller
// rebuilds the state from the base.
var errStale = errors.New("scan records do not match the subvolume")

// walker derives the layer of a read-only snapshot from the records of the
// previous scan and the inodes changed since it. It visits only the changed
// paths and the directories above them.
type walker struct {
	ctx     context.Context
	snap    string // the read-only snapshot being scanned
	snapFD  int
	snapDev uint64
	base    string // the base subvolume's root
	baseFD  int
	baseGen uint64
	ids     delta.IDs // the home's content ID scheme
	empty   delta.ID  // the empty tree under ids
	saver   delta.BlobSaver
	meta    metaDir // records of the previous state (nil: none)
	prev    *head

	changed map[uint64]inodeItem // inodes changed since the previous state
	items   map[uint64]inodeItem
	paths   map[uint64][]string
	dirty   map[string]bool            // paths whose own entry must be looked at
	onPath  map[string]bool            // directories above dirty paths
	kids    map[string]map[string]bool // directory -> its dirty or on-path names
	reads   map[uint64]readResult
	recs    map[recKey]*record
	links   linkIndex
	xbuf    []byte
	files   *fstree.FileReader // made on first use, reused for every file
	stats   fstree.ScanStats
	p       *pass
}

type readResult struct {
	ctime int64
	c     content
}

// pass is one walk from the root. A walk that finds its dirty set too small
// (a hardlinked inode with names outside it, a moved directory) grows the
// set and is run again.
type pass struct {
	primary   map[uint64]string   // multi-link inode -> its first name in the layer
	emitted   map[uint64][]string // multi-link inode -> its names in the layer
	multi     map[uint64]bool     // multi-link inodes looked at
	recs      map[recKey]*record  // directory records that changed
	alive     map[recKey]bool     // directories in the new layer
	gone      map[recKey]string   // directories that left a listing -> old path
	moved     []string            // old paths of directories that moved
	mergeMemo map[string]bool
	grow      bool
}

// walkResult is a scanned layer and what to write to the records.
type walkResult struct {
	root, key delta.ID
	recs      map[recKey]*record
	drop      []recKey
	links     linkIndex
	linksDirt bool
	changed   map[uint64]inodeItem
}

func newWalker(ctx context.Context, ids delta.IDs, snap, base string, baseGen uint64, saver delta.BlobSaver, meta metaDir, prev *head) (*walker, error) {
	fd, err := openDir(snap)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, err
	}
	baseFD, err := openDir(base)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &walker{
		ctx: ctx, snap: snap, snapFD: fd, snapDev: st.Dev, base: base, baseFD: baseFD, baseGen: baseGen,
		ids: ids, empty: ids.EmptyTree(), saver: saver, meta: meta, prev: prev,
		changed: map[uint64]inodeItem{}, items: map[uint64]inodeItem{}, paths: map[uint64][]string{},
		dirty: map[string]bool{}, onPath: map[string]bool{}, kids: map[string]map[string]bool{},
		reads: map[uint64]readResult{}, recs: map[recKey]*record{}, xbuf: make([]byte, xattrBufSize),
	}, nil
}

func (w *walker) close() {
	w.closeFiles()
	unix.Close(w.snapFD)
	unix.Close(w.baseFD)
}

// saveTree saves a directory's tree after the chunks read before it: once
// the file reader exists its pipeline may still be saving them.
func (w *walker) saveTree(id delta.ID, data []byte) error {
	if w.files != nil {
		return w.files.Save(w.ctx, delta.BlobTree, id, data)
	}
	_, err := w.saver.SaveBlob(w.ctx, delta.BlobTree, id, data)
	return err
}

// closeFiles waits for the file reader's pending saves; after it the
// walk's stats are final.
func (w *walker) closeFiles() error {
	if w.files == nil {
		return nil
	}
	err := w.files.Close()
	w.files = nil
	return err
}

// run finds the inodes changed since the previous state and walks.
func (w *walker) run() (*walkResult, error) {
	err := changedInodes(w.snapFD, w.prev.Gen, func(ino uint64, it inodeItem) error {
		w.changed[ino] = it
		w.items[ino] = it
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("changed inodes of %s: %w", w.snap, err)
	}
	for ino, it := range w.changed {
		if it.Nlink == 0 {
			continue // unlinked but still open when the snapshot was taken
		}
		ps, err := w.inoPaths(ino)
		if err != nil {
			return nil, err
		}
		for _, p := range ps {
			w.addDirty(p)
		}
	}
	for n := 0; ; n++ {
		if n == 32 {
			return nil, fmt.Errorf("scan %s: change set did not settle", w.snap)
		}
		res, err := w.walkOnce()
		if err != nil || !w.p.grow {
			return res, err
		}
	}
}

func (w *walker) addDirty(p string) bool {
	if w.dirty[p] {
		return false
	}
	w.dirty[p] = true
	for p != "" {
		parent, name := path.Dir(p), path.Base(p)
		if parent == "." {
			parent = ""
		}
		if w.kids[parent] == nil {
			w.kids[parent] = map[string]bool{}
		}
		w.kids[parent][name] = true
		if w.onPath[parent] {
			break
		}
		w.onPath[parent] = true
		p = parent
	}
	return true
}

// expand makes every name of inode ino dirty, so that all of them are
// looked at together; a name that was not grows the set.
func (w *walker) expand(ino uint64) error {
	ps, err := w.inoPaths(ino)
	if errors.Is(err, unix.ENOENT) {
		w.p.multi[ino] = true // gone: finish drops it from the link index
		return nil
	}
	if err != nil {
		return err
	}
	for _, p := range ps {
		if w.addDirty(p) {
			w.p.grow = true
		}
	}
	return nil
}

func (w *walker) inoPaths(ino uint64) ([]string, error) {
	if ps, ok := w.paths[ino]; ok {
		return ps, nil
	}
	var ps []string
	if ino == firstFreeObjectID {
		ps = []string{""}
	} else {
		var err error
		if ps, err = inoPaths(w.snapFD, ino); err != nil {
			return nil, fmt.Errorf("scan %s: %w", w.snap, err)
		}
		for _, p := range ps {
			if !delta.ValidPath(p) {
				return nil, fmt.Errorf("scan %s: inode %d has path %q: %w", w.snap, ino, p, errdefs.ErrCorrupt)
			}
		}
		slices.Sort(ps)
	}
	w.paths[ino] = ps
	return ps, nil
}

func (w *walker) item(ino uint64) (inodeItem, error) {
	if it, ok := w.items[ino]; ok {
		return it, nil
	}
	it, err := lookupInode(w.snapFD, ino)
	if err != nil {
		return it, fmt.Errorf("scan %s: %w", w.snap, err)
	}
	w.items[ino] = it
	return it, nil
}

// record returns the previous record of a directory inode, or nil.
func (w *walker) record(k recKey) (*record, error) {
	if r, ok := w.recs[k]; ok {
		return r, nil
	}
	var r *record
	if w.meta != "" {
		var err error
		if r, err = w.meta.readRecord(k); err != nil {
			return nil, fmt.Errorf("%w: %v", errStale, err)
		}
	}
	w.recs[k] = r
	return r, nil
}

func (w *walker) walkOnce() (*walkResult, error) {
	w.p = &pass{
		primary: map[uint64]string{}, emitted: map[uint64][]string{}, multi: map[uint64]bool{},
		recs: map[recKey]*record{}, alive: map[recKey]bool{}, gone: map[recKey]string{},
		mergeMemo: map[string]bool{},
	}
	it, err := w.item(firstFreeObjectID)
	if err != nil {
		return nil, err
	}
	rk := recKey{firstFreeObjectID, it.Gen}
	prev, err := w.record(rk)
	if err != nil {
		return nil, err
	}
	if prev == nil && w.prev.Root != w.ids.EmptyTree() {
		return nil, fmt.Errorf("%w: no record of the root", errStale)
	}
	if prev != nil && w.ids.Hash(prev.Tree) != w.prev.Root {
		return nil, fmt.Errorf("%w: root record does not hash to the state's tree", errStale)
	}
	r, err := w.dir("", false, firstFreeObjectID, it, prev)
	if err != nil {
		return nil, err
	}
	w.p.alive[rk] = true
	if err := w.affectedLinks(); err != nil {
		return nil, err
	}
	if w.p.grow {
		return nil, nil
	}
	return w.finish(r)
}
