package btrfs

import (
	"bytes"
	"context"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// equivalent checks that base+a and base+b are the same merged filesystem
// (contents, types, modes, ownership, xattrs, mtimes of files and
// directories), whatever their layers look like. It opens only subtrees
// whose layer stacks differ. Hardlink entries are compared by the content
// of the file they name; link structure itself is not compared.
func equivalent(ctx context.Context, loader delta.BlobLoader, base, a, b delta.ID) error {
	c := &equiv{ctx: ctx, loader: loader, roots: []delta.ID{base, a, b}}
	return c.dir("", []lay{{0, base}, {1, a}}, []lay{{0, base}, {2, b}})
}

type equiv struct {
	ctx    context.Context
	loader delta.BlobLoader
	roots  []delta.ID // by layer: base, a, b
}

// lay is one layer's tree of a directory.
type lay struct {
	layer int
	id    delta.ID
}

type mentry struct {
	e     delta.Entry
	layer int
	sub   []lay
}

func (c *equiv) tree(id delta.ID) (*delta.Tree, error) {
	data, err := c.loader.LoadBlob(c.ctx, delta.BlobTree, id)
	if err != nil {
		return nil, err
	}
	return delta.DecodeTree(data)
}

// merged lists a directory whose layers are stack, bottom first.
func (c *equiv) merged(stack []lay) (map[string]mentry, error) {
	out := map[string]mentry{}
	for _, l := range stack {
		t, err := c.tree(l.id)
		if err != nil {
			return nil, err
		}
		for _, e := range t.Entries {
			below, ok := out[e.Name]
			switch {
			case e.Type == delta.TypeWhiteout:
				delete(out, e.Name)
			case e.Type == delta.TypeDir && ok && below.e.Type == delta.TypeDir && !e.Opaque:
				out[e.Name] = mentry{e: e, layer: l.layer, sub: append(slices.Clone(below.sub), lay{l.layer, e.Subtree})}
			case e.Type == delta.TypeDir:
				out[e.Name] = mentry{e: e, layer: l.layer, sub: []lay{{l.layer, e.Subtree}}}
			default:
				out[e.Name] = mentry{e: e, layer: l.layer}
			}
		}
	}
	return out, nil
}

func (c *equiv) dir(rel string, x, y []lay) error {
	if err := c.ctx.Err(); err != nil {
		return err
	}
	if slices.EqualFunc(x, y, func(a, b lay) bool { return a.id == b.id }) {
		return nil
	}
	ma, err := c.merged(x)
	if err != nil {
		return err
	}
	mb, err := c.merged(y)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(ma)+len(mb))
	for n := range ma {
		names = append(names, n)
	}
	for n := range mb {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range slices.Compact(names) {
		p := path.Join(rel, n)
		ea, inA := ma[n]
		eb, inB := mb[n]
		if inA != inB {
			return fmt.Errorf("/%s exists in one state only: %w", p, errdefs.ErrCorrupt)
		}
		fa, err := c.resolve(ea)
		if err != nil {
			return err
		}
		fb, err := c.resolve(eb)
		if err != nil {
			return err
		}
		if !sameEntry(&fa, &fb) {
			return fmt.Errorf("/%s differs (%s vs %s): %w", p, fa.Type, fb.Type, errdefs.ErrCorrupt)
		}
		if fa.Type == delta.TypeDir {
			if err := c.dir(p, ea.sub, eb.sub); err != nil {
				return err
			}
		}
	}
	return nil
}

// resolve returns the entry a hardlink entry stands for: the file it names
// in its own layer.
func (c *equiv) resolve(m mentry) (delta.Entry, error) {
	if m.e.Type != delta.TypeHardlink {
		return m.e, nil
	}
	id := c.roots[m.layer]
	parts := strings.Split(m.e.Target, "/")
	for i, part := range parts {
		t, err := c.tree(id)
		if err != nil {
			return delta.Entry{}, err
		}
		e := t.Find(part)
		if e == nil || (i < len(parts)-1 && e.Type != delta.TypeDir) {
			return delta.Entry{}, fmt.Errorf("hardlink target %s missing: %w", m.e.Target, errdefs.ErrCorrupt)
		}
		if i == len(parts)-1 {
			out := *e
			out.Name = m.e.Name
			return out, nil
		}
		id = e.Subtree
	}
	return delta.Entry{}, fmt.Errorf("hardlink target %q: %w", m.e.Target, errdefs.ErrCorrupt)
}

func sameEntry(x, y *delta.Entry) bool {
	if x.Type != y.Type || x.Mode != y.Mode || x.UID != y.UID || x.GID != y.GID || x.MtimeNs != y.MtimeNs ||
		x.Size != y.Size || x.Target != y.Target || x.Rdev != y.Rdev || !delta.SameChunks(x, y) ||
		!slices.Equal(x.Holes, y.Holes) {
		return false
	}
	return slices.EqualFunc(x.Xattrs, y.Xattrs, func(a, b delta.Xattr) bool {
		return a.Name == b.Name && bytes.Equal(a.Value, b.Value)
	})
}
