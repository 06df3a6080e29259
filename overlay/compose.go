package overlay

import (
	"bytes"
	"context"
	"fmt"
	"path"
	"slices"
	"sync"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// composer turns a stacked root's upper tree U, which is relative to the
// frozen layer F, into the tree a plain root's upper would hold for the
// same state (relative to the base B), following what overlay itself does
// to a plain upper holding F when the same changes are made through it:
//
//   - a name U does not touch keeps F's entry (subtree IDs are reused, so
//     composing costs what U holds, not what F holds);
//   - a whiteout in U deletes the name; it stays a whiteout only where B
//     shows the name (overlay whites out only what a lower layer has);
//   - a non-opaque directory of U merges with F's directory of that name,
//     keeping F's opaque flag; with none in F it is B's directory, copied up;
//   - an opaque directory of U, or one replacing a non-directory of F,
//     replaces the name with U's contents;
//   - any other entry of U replaces the name.
//
// The state key is then derived from the composed tree as a scan derives
// it: directory mtimes left out, and empty directories that only repeat
// B's directory (copy-up residue) left out.
type composer struct {
	ids    delta.IDs
	empty  delta.ID // the empty tree under ids
	loader delta.BlobLoader
	upper  map[delta.ID][]byte // the upper scan's trees
	saver  delta.BlobSaver     // nil: hash only
	made   map[delta.ID]*delta.Tree
	keys   map[keyMemo]delta.ID
	shared *keyCache // nil: none
	base   string    // the base dir, shared's key
	xbuf   []byte
}

type keyMemo struct {
	id     delta.ID
	rel    string
	opaque bool
}

func newComposer(ids delta.IDs, loader delta.BlobLoader, upper map[delta.ID][]byte, saver delta.BlobSaver) *composer {
	return &composer{ids: ids, empty: ids.EmptyTree(), loader: loader, upper: upper, saver: saver, made: map[delta.ID]*delta.Tree{},
		keys: map[keyMemo]delta.ID{}, xbuf: make([]byte, fsat.XattrBufSize)}
}

func (c *composer) upperTree(id delta.ID) (*delta.Tree, error) {
	data, ok := c.upper[id]
	if !ok {
		return nil, fmt.Errorf("upper tree %s not in the scan: %w", id.Short(), errdefs.ErrCorrupt)
	}
	return delta.DecodeTree(data)
}

// tree returns a composed tree or one of the store (the frozen layer's).
func (c *composer) tree(ctx context.Context, id delta.ID) (*delta.Tree, error) {
	if t, ok := c.made[id]; ok {
		return t, nil
	}
	return delta.LoadTree(ctx, c.loader, id)
}

// openBase opens directory name of the base directory fd, or -1 when fd is
// -1 or the base has no directory there.
func openBase(fd int, name string) int {
	if fd < 0 {
		return -1
	}
	sub, err := fsat.Open(fd, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return -1
	}
	return sub
}

func baseHas(fd int, name string) bool {
	if fd < 0 {
		return false
	}
	var st unix.Stat_t
	return unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
}

// dir composes upper tree u over frozen tree f (zero: F has nothing here)
// at rel; base is B's directory at rel (-1: hidden or absent). It saves
// and returns the composed tree.
func (c *composer) dir(ctx context.Context, rel string, u, f delta.ID, base int) (delta.ID, error) {
	if err := ctx.Err(); err != nil {
		return delta.ID{}, err
	}
	ut, err := c.upperTree(u)
	if err != nil {
		return delta.ID{}, err
	}
	out := &delta.Tree{}
	var ft *delta.Tree
	if !f.IsZero() {
		if ft, err = delta.LoadTree(ctx, c.loader, f); err != nil {
			return delta.ID{}, err
		}
		// F's names U does not touch, as they are (both lists are sorted).
		j := 0
		for _, fe := range ft.Entries {
			for j < len(ut.Entries) && ut.Entries[j].Name < fe.Name {
				j++
			}
			if j == len(ut.Entries) || ut.Entries[j].Name != fe.Name {
				out.Entries = append(out.Entries, fe)
			}
		}
	}
	for _, ue := range ut.Entries {
		var fe *delta.Entry
		if ft != nil {
			fe = ft.Find(ue.Name)
		}
		ne := ue
		switch {
		case ue.Type == delta.TypeWhiteout:
			if !baseHas(base, ue.Name) {
				continue
			}
		case ue.Type == delta.TypeDir:
			crel := path.Join(rel, ue.Name)
			var sub delta.ID
			switch {
			case !ue.Opaque && fe != nil && fe.Type == delta.TypeDir:
				ne.Opaque = fe.Opaque
				cb := -1
				if !fe.Opaque {
					cb = openBase(base, ue.Name)
				}
				sub, err = c.dir(ctx, crel, ue.Subtree, fe.Subtree, cb)
				closeFD(cb)
			case !ue.Opaque && fe == nil:
				cb := openBase(base, ue.Name)
				sub, err = c.dir(ctx, crel, ue.Subtree, delta.ID{}, cb)
				closeFD(cb)
			default:
				ne.Opaque = ue.Opaque || baseHas(base, ue.Name)
				sub, err = c.dir(ctx, crel, ue.Subtree, delta.ID{}, -1)
			}
			if err != nil {
				return delta.ID{}, err
			}
			ne.Subtree = sub
		}
		out.Entries = append(out.Entries, ne)
	}
	out.Sort()
	if err := out.Check(); err != nil {
		return delta.ID{}, fmt.Errorf("composed /%s: %w", rel, err)
	}
	lists := out.MakeIndirect(c.ids)
	data := out.Encode()
	id := c.ids.Hash(data)
	c.made[id] = out
	if c.saver != nil {
		for _, l := range lists {
			if _, err := c.saver.SaveBlob(ctx, delta.BlobTree, l.ID, l.Data); err != nil {
				return delta.ID{}, fmt.Errorf("save chunk list of /%s: %w", rel, err)
			}
		}
		if _, err := c.saver.SaveBlob(ctx, delta.BlobTree, id, data); err != nil {
			return delta.ID{}, fmt.Errorf("save tree of /%s: %w", rel, err)
		}
	}
	return id, nil
}

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}

// key derives the state key of composed tree id at rel, as fstree.Scan
// does: opaque says an ancestor is opaque (nothing of B shows below it).
func (c *composer) key(ctx context.Context, rel string, id delta.ID, opaque bool, base int) (delta.ID, error) {
	m := keyMemo{id, rel, opaque}
	if k, ok := c.keys[m]; ok {
		return k, nil
	}
	if k, ok := c.shared.get(c.base, m); ok {
		return k, nil
	}
	if err := ctx.Err(); err != nil {
		return delta.ID{}, err
	}
	t, err := c.tree(ctx, id)
	if err != nil {
		return delta.ID{}, err
	}
	st := &delta.Tree{Entries: make([]delta.Entry, 0, len(t.Entries))}
	for _, e := range t.Entries {
		if e.Type == delta.TypeDir {
			cb := -1
			if !opaque && !e.Opaque {
				cb = openBase(base, e.Name)
			}
			k, err := c.key(ctx, path.Join(rel, e.Name), e.Subtree, opaque || e.Opaque, cb)
			residue := err == nil && !opaque && k == c.empty && c.residue(cb, &e)
			closeFD(cb)
			if err != nil {
				return delta.ID{}, err
			}
			if residue {
				continue
			}
			e.MtimeNs = 0
			e.Subtree = k
		}
		st.Entries = append(st.Entries, e)
	}
	k := c.ids.Hash(st.Encode())
	c.keys[m] = k
	if _, made := c.made[id]; !made {
		c.shared.put(c.base, m, k) // a stored tree: its key holds for every later scan
	}
	return k, nil
}

// keyCache remembers the state keys of stored trees (the frozen layers'
// subtrees) across scans of the backend's stacked roots, so a turn that
// changed little does not reload the whole frozen tree. A key depends on
// the tree, its place and the base (residue), all immutable.
type keyCache struct {
	mu sync.Mutex
	m  map[string]map[keyMemo]delta.ID // by base dir
	n  int
}

// keyCacheMax bounds the cache (about 100 bytes an entry): past it, it
// starts again empty.
const keyCacheMax = 1 << 16

func (kc *keyCache) get(base string, m keyMemo) (delta.ID, bool) {
	if kc == nil {
		return delta.ID{}, false
	}
	kc.mu.Lock()
	defer kc.mu.Unlock()
	k, ok := kc.m[base][m]
	return k, ok
}

func (kc *keyCache) put(base string, m keyMemo, k delta.ID) {
	if kc == nil {
		return
	}
	kc.mu.Lock()
	defer kc.mu.Unlock()
	if kc.m == nil || kc.n >= keyCacheMax {
		kc.m, kc.n = map[string]map[keyMemo]delta.ID{}, 0
	}
	if kc.m[base] == nil {
		kc.m[base] = map[keyMemo]delta.ID{}
	}
	kc.m[base][m] = k
	kc.n++
}

// residue reports a directory entry that only repeats base directory fd's
// metadata (upperScan.residue, against the base).
func (c *composer) residue(fd int, e *delta.Entry) bool {
	if fd < 0 || e.Opaque {
		return false
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return false
	}
	if st.Mode&07777 != e.Mode || st.Uid != e.UID || st.Gid != e.GID {
		return false
	}
	lx, err := fsat.XattrsFD(fd, c.xbuf, isOverlayXattr)
	if err != nil {
		return false
	}
	return slices.EqualFunc(lx, e.Xattrs, func(a, b delta.Xattr) bool {
		return a.Name == b.Name && bytes.Equal(a.Value, b.Value)
	})
}
