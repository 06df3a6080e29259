package delta

import (
	"context"
	"fmt"
	"strings"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Limits every reader enforces (docs/FORMAT.md, "Limits"). A stored object
// that declares more is corruption: a reader never sizes a buffer, a loop or
// a restore by a number it has not bounded first.
const (
	// MaxTreeSize bounds one encoded tree: a directory of about 100,000
	// entries with long names. Writers refuse to store a larger directory.
	MaxTreeSize = 32 << 20
	// MaxTreeEntries bounds the entries of one tree.
	MaxTreeEntries = 1 << 20
	// MaxStateEntries and MaxStateBytes bound what one state expands to
	// when restored: trees are shared by ID, so a few kilobytes of trees
	// can describe billions of files.
	MaxStateEntries = 1 << 24
	MaxStateBytes   = 1 << 40
	// MaxSymlinkTarget is Linux's PATH_MAX less the NUL: symlink(2) refuses
	// longer targets.
	MaxSymlinkTarget = 4095
	// MaxXattrName and MaxXattrValue are Linux's XATTR_NAME_MAX and
	// XATTR_SIZE_MAX.
	MaxXattrName  = 255
	MaxXattrValue = 64 << 10
	// MaxDepth bounds directory nesting: a path of PATH_MAX bytes holds at
	// most 2,048 components.
	MaxDepth = 2048
)

// OverlayXattrPrefix names overlayfs's own attributes, which are never
// state: the opaque marker is Entry.Opaque, the rest is kernel bookkeeping.
const OverlayXattrPrefix = "trusted.overlay."

// MaxRawLength is the largest plaintext a blob of type t may have: a data
// blob is one chunk, a tree at most MaxTreeSize.
func MaxRawLength(t BlobType) uint64 {
	switch t {
	case BlobData:
		return ChunkMax
	case BlobTree:
		return MaxTreeSize
	}
	return 0
}

// StateRules says what kind of state a tree roots and how to learn chunk
// sizes. The same rules run before every restore and in every verify, so a
// checkpoint that verifies is one that restores.
type StateRules struct {
	// Plain says the tree is a complete state (a base, a process image), not
	// a writable layer: whiteouts and opaque directories are refused. A
	// writable layer instead refuses trusted.overlay.* xattrs, which would
	// change what overlayfs shows.
	Plain bool
	// ChunkSize returns a data blob's plaintext length without reading it
	// (verify: from pack headers). Nil: a restore checks each file's size
	// as it writes it (CheckFileSize).
	ChunkSize func(id ID) (uint64, error)
}

// Footprint is what a state expands to when restored.
type Footprint struct {
	Entries uint64 // names, hardlinks and whiteouts included
	Files   uint64
	Bytes   uint64 // file data a restore writes (holes excluded)
	Trees   int    // distinct trees read
	Chunks  int    // distinct chunks named
}

type treeInfo struct {
	entries, files, bytes uint64
	links                 bool // holds a hardlink, here or below
}

// CheckState reads every distinct tree of the state rooted at root once,
// applies every rule a restore applies to each entry, computes the state's
// footprint (shared subtrees counted each time they appear, as a restore
// writes them) and refuses a state over the limits. Hardlinks are checked in
// a second pass over the paths that hold them: a hardlink's target is a path
// from root (the root of this tree, a layer's own root for a layer) and must
// name a file that comes earlier in canonical order. Errors wrap
// errdefs.ErrCorrupt and name the path.
func CheckState(ctx context.Context, loader BlobLoader, root ID, rules StateRules) (Footprint, error) {
	c := &stateChecker{loader: loader, rules: rules, root: root, info: map[ID]*treeInfo{}, chunks: map[ID]bool{}, trees: map[ID]*Tree{}}
	ti, err := c.visit(ctx, root, "", 0)
	if err != nil {
		return Footprint{}, err
	}
	fp := Footprint{Entries: ti.entries, Files: ti.files, Bytes: ti.bytes, Trees: len(c.info), Chunks: len(c.chunks)}
	if ti.links {
		if err := c.links(ctx, root, nil); err != nil {
			return fp, err
		}
	}
	return fp, nil
}

type stateChecker struct {
	loader BlobLoader
	rules  StateRules
	root   ID
	trees  map[ID]*Tree // decoded trees of the hardlink pass
	info   map[ID]*treeInfo
	chunks map[ID]bool
}

// CorruptAt is the error of a state that breaks a rule at path rel: the
// path, then what is wrong, wrapping errdefs.ErrCorrupt.
func CorruptAt(rel string, format string, args ...any) error {
	return fmt.Errorf("/%s: %s: %w", rel, fmt.Sprintf(format, args...), errdefs.ErrCorrupt)
}

// addCapped adds b to a, saturating just above limit so that an exponential
// DAG cannot overflow the count.
func addCapped(a, b, limit uint64) uint64 {
	if a > limit || b > limit || a+b > limit {
		return limit + 1
	}
	return a + b
}

func (c *stateChecker) visit(ctx context.Context, id ID, rel string, depth int) (*treeInfo, error) {
	if ti, ok := c.info[id]; ok {
		return ti, nil
	}
	if depth > MaxDepth {
		return nil, CorruptAt(rel, "directories nested more than %d deep", MaxDepth)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t, err := LoadTree(ctx, c.loader, id)
	if err != nil {
		return nil, fmt.Errorf("/%s: %w", rel, err)
	}
	if len(t.Entries) > MaxTreeEntries {
		return nil, CorruptAt(rel, "tree %s has %d entries, more than the limit %d", id.Short(), len(t.Entries), MaxTreeEntries)
	}
	ti := &treeInfo{}
	for i := range t.Entries {
		e := &t.Entries[i]
		p := joinRel(rel, e.Name)
		if err := CheckEntry(e, c.rules.Plain); err != nil {
			return nil, fmt.Errorf("/%s: %w", p, err)
		}
		ti.entries = addCapped(ti.entries, 1, MaxStateEntries)
		switch e.Type {
		case TypeDir:
			sub, err := c.visit(ctx, e.Subtree, p, depth+1)
			if err != nil {
				return nil, err
			}
			ti.entries = addCapped(ti.entries, sub.entries, MaxStateEntries)
			ti.files = addCapped(ti.files, sub.files, MaxStateEntries)
			ti.bytes = addCapped(ti.bytes, sub.bytes, MaxStateBytes)
			ti.links = ti.links || sub.links
		case TypeFile:
			if err := c.file(p, e); err != nil {
				return nil, err
			}
			ti.files = addCapped(ti.files, 1, MaxStateEntries)
			// What a restore writes: a sparse file's holes take no space.
			ti.bytes = addCapped(ti.bytes, e.DataSize(), MaxStateBytes)
		case TypeHardlink:
			ti.links = true
		}
		if ti.entries > MaxStateEntries {
			return nil, CorruptAt(rel, "state expands to more than %d entries", uint64(MaxStateEntries))
		}
		if ti.bytes > MaxStateBytes {
			return nil, CorruptAt(rel, "state expands to more than %d bytes", uint64(MaxStateBytes))
		}
	}
	c.info[id] = ti
	return ti, nil
}

func (c *stateChecker) file(rel string, e *Entry) error {
	// Every chunk holds 1 to ChunkMax bytes, so a file without data has no
	// chunks. Holes hold no chunk: the chunks add up to the data runs.
	if !e.Resolved() {
		return UnresolvedError(e)
	}
	if n, data := e.ChunkCount(), e.DataSize(); n > data || data > n*ChunkMax {
		return CorruptAt(rel, "file of %d data bytes (size %d, %d holes) cannot be %d chunks of 1 to %d bytes",
			data, e.Size, len(e.Holes), n, ChunkMax)
	}
	var sum uint64
	for _, ch := range e.Chunks {
		c.chunks[ch] = true
		if c.rules.ChunkSize == nil {
			continue
		}
		n, err := c.rules.ChunkSize(ch)
		if err != nil {
			return fmt.Errorf("/%s: chunk %s: %w", rel, ch.Short(), err)
		}
		sum += n
	}
	if c.rules.ChunkSize != nil {
		if err := CheckFileSize(e, sum); err != nil {
			return fmt.Errorf("/%s: %w", rel, err)
		}
	}
	return nil
}

// CheckFileSize is the rule that a file's chunks add up to its size less
// its holes.
func CheckFileSize(e *Entry, sum uint64) error {
	if want := e.DataSize(); sum != want {
		return fmt.Errorf("chunks hold %d bytes, entry says %d: %w", sum, want, errdefs.ErrCorrupt)
	}
	return nil
}

// CheckEntry applies the per-entry rules a restore needs beyond the tree
// invariants DecodeTree checks (docs/FORMAT.md, "Limits" and "Writable
// layers"). plain is StateRules.Plain.
func CheckEntry(e *Entry, plain bool) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%s: %s: %w", e.Type, fmt.Sprintf(format, args...), errdefs.ErrCorrupt)
	}
	for _, x := range e.Xattrs {
		switch {
		case len(x.Name) > MaxXattrName:
			return bad("xattr name of %d bytes, more than %d", len(x.Name), MaxXattrName)
		case len(x.Value) > MaxXattrValue:
			return bad("xattr %s: value of %d bytes, more than %d", x.Name, len(x.Value), MaxXattrValue)
		case strings.ContainsRune(x.Name, 0):
			return bad("xattr name holds a NUL")
		case !plain && strings.HasPrefix(x.Name, OverlayXattrPrefix):
			return bad("xattr %s is overlayfs's own and never part of a layer", x.Name)
		}
	}
	if !plain {
		// A layer is the sandbox's own writing: its device nodes follow the
		// one device rule (CheckDevice). Bases and process images are not
		// the agent's and keep theirs.
		if err := CheckDevice(*e); err != nil {
			return err
		}
	}
	switch e.Type {
	case TypeSymlink:
		if len(e.Target) == 0 || len(e.Target) > MaxSymlinkTarget || strings.ContainsRune(e.Target, 0) {
			return bad("target of %d bytes (1 to %d, no NUL)", len(e.Target), MaxSymlinkTarget)
		}
	case TypeWhiteout:
		if plain {
			return bad("a whiteout outside a writable layer")
		}
	case TypeDir:
		if plain && e.Opaque {
			return bad("an opaque directory outside a writable layer")
		}
	}
	return nil
}

func joinRel(rel, name string) string {
	if rel == "" {
		return name
	}
	return rel + "/" + name
}

// links walks every path below tree id whose subtree holds a hardlink and
// checks each hardlink's target. at is the path of the tree from the root.
func (c *stateChecker) links(ctx context.Context, id ID, at []string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t, err := c.tree(ctx, id)
	if err != nil {
		return err
	}
	for i := range t.Entries {
		e := &t.Entries[i]
		p := append(at[:len(at):len(at)], e.Name)
		switch e.Type {
		case TypeDir:
			if c.info[e.Subtree].links {
				if err := c.links(ctx, e.Subtree, p); err != nil {
					return err
				}
			}
		case TypeHardlink:
			if err := c.linkTarget(ctx, e.Target, p); err != nil {
				return err
			}
		}
	}
	return nil
}

// linkTarget checks that target names a file entry before the hardlink at
// path link in canonical (depth-first, name-ordered) order.
func (c *stateChecker) linkTarget(ctx context.Context, target string, link []string) error {
	rel := strings.Join(link, "/")
	comps := strings.Split(target, "/")
	for i, comp := range comps {
		if i >= len(link) {
			return CorruptAt(rel, "hardlink to %q, a path below the link itself", target)
		}
		if comp < link[i] {
			break // every name below comp comes before the link
		}
		if comp > link[i] || i == len(comps)-1 {
			return CorruptAt(rel, "hardlink to %q, which does not come before it", target)
		}
	}
	e, err := c.resolve(ctx, comps)
	if err != nil {
		return fmt.Errorf("/%s: hardlink target %q: %w", rel, target, err)
	}
	if e == nil || e.Type != TypeFile {
		return CorruptAt(rel, "hardlink to %q, which is not a file of this tree", target)
	}
	return nil
}

// resolve returns the entry at comps below the checked root, or nil.
func (c *stateChecker) resolve(ctx context.Context, comps []string) (*Entry, error) {
	id := c.root
	var e *Entry
	for i, comp := range comps {
		t, err := c.tree(ctx, id)
		if err != nil {
			return nil, err
		}
		if e = t.Find(comp); e == nil {
			return nil, nil
		}
		if i < len(comps)-1 {
			if e.Type != TypeDir {
				return nil, nil
			}
			id = e.Subtree
		}
	}
	return e, nil
}

// tree loads a tree for the hardlink pass, which revisits the trees on the
// paths to link targets.
func (c *stateChecker) tree(ctx context.Context, id ID) (*Tree, error) {
	if t, ok := c.trees[id]; ok {
		return t, nil
	}
	t, err := LoadTree(ctx, c.loader, id)
	if err != nil {
		return nil, err
	}
	c.trees[id] = t
	return t, nil
}
