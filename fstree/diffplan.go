package fstree

import (
	"context"
	"errors"
	"fmt"
	"github.com/turnsnap/turnsnap/delta"
	"path"
	"slices"
	"strings"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// A diff apply turns a directory whose state is tree L (the live state,
// just scanned) into tree T (a checkpoint's) by touching only the names in
// which L and T differ: subtrees with equal IDs are skipped unread, a file
// in both states is rewritten in place (it keeps its inode, so a process
// that remembers inode numbers, such as SQLite, survives), and anything
// else is removed, created or replaced. It runs in two passes:
//
//  1. PlanDiff decides every change and loads (and so hash-verifies) every
//     chunk the changes need, within a memory bound, after CheckState has
//     passed T and the filesystem has room: a missing or corrupt object, or
//     a full disk, is found before anything is written.
//  2. DiffPlan.Apply makes the changes and then reads back every name it
//     wrote (DiffPlan.Verify).
//
// A plan the in-place path cannot do safely fails with ErrDiffUnsupported,
// and the caller rebuilds the layer whole instead.

// DefaultDiffMemory bounds the chunk bytes one plan holds: a rollback to a
// checkpoint a few files away needs kilobytes; one that would rewrite more
// than this is as cheap to rebuild whole.
const DefaultDiffMemory = 64 << 20

// ErrDiffUnsupported says a diff cannot be applied in place (a changed
// multiply-linked file, a diff over the memory bound): nothing was
// written, and the caller falls back to rebuilding the layer.
var ErrDiffUnsupported = errors.New("diff cannot be applied in place")

// DiffOptions configures PlanDiff.
type DiffOptions struct {
	// Loader reads the target's blobs, verifying each.
	Loader delta.BlobLoader
	// Live reads the live tree's trees (a scan's, kept in memory).
	Live delta.BlobLoader
	// IDs is the home's content ID scheme: Verify hashes what it wrote
	// under it.
	IDs delta.IDs
	// AllowDevices and Plain are as in ApplyOptions.
	AllowDevices bool
	Plain        bool
	// MaxBytes bounds the chunk bytes the plan holds (0: DefaultDiffMemory).
	MaxBytes int64
	// Names returns how many names of the state a multiply-linked file has
	// (default: its link count). Overlay discounts the link its index keeps.
	Names func(dirFD int, name string, st *unix.Stat_t) (uint64, error)
	// Removing is called for every name (directory contents included)
	// just before Apply removes it; overlay drops the index entry of a
	// copied-up file there, so its base file shows again.
	Removing func(dirFD int, name, rel string) error
	// Translate reads written entries back the way the scan that made L did
	// (ScanOptions.Translate).
	Translate func(rel string, st *unix.Stat_t, e *delta.Entry) (bool, error)
	// LiveCache is the scan cache of the scan that made the live tree. With
	// it Verify also computes the state keys of the directories it checks
	// (and the target's), so a cache built from its result lets a tracked
	// scan take them whole (diffstate.go). Residue is that scan's
	// ScanOptions.Residue.
	LiveCache *ScanCache
	Residue   func(rel string, e *delta.Entry) bool
	// Phase, if set, is called once after Apply's first change (tests kill
	// the process there).
	Phase func()
	// KeptDir, if set, is called for every live directory the plan keeps
	// but changes (it looks into it or sets its metadata) before it does;
	// an error wrapping ErrDiffUnsupported gives the diff up. Overlay
	// refuses a renamed base directory there: its upper holds less than
	// its tree, and its tree marks it opaque, which the upper must not be.
	KeptDir func(dirFD int, name, rel string) error
}

// change is one name that differs between L and T, in canonical order
// (a directory's changes come before its own final metadata).
type change struct {
	rel    string
	remove bool         // the live name goes first (it differs in kind, or T lacks it)
	live   *delta.Entry // the live entry; nil: the name is new
	target *delta.Entry // the target's entry; nil: removed only
	how    changeKind
	// opaque: the name is below a directory the target marks opaque, so
	// nothing of the lower shows there (Mountable).
	opaque bool
}

type changeKind uint8

const (
	changeCreate  changeKind = iota // make target (a new inode), whole subtree for a dir
	changeRewrite                   // regular file in place: new content and metadata
	changeMeta                      // metadata only: a file with equal content, a node
	changeDirMeta                   // a directory kept, after its changed children
)

// DiffPlan is a checked, loaded diff, ready to apply to the directory it
// was planned on.
type DiffPlan struct {
	opts    DiffOptions
	trees   TreeMemo // the loader's, if it keeps decoded trees
	root    string
	target  delta.ID
	changes []change
	chunks  map[delta.ID][]byte
	held    int64
	// dirs maps each kept directory whose children changed to the target's
	// names in it, for Verify; kept holds its target entries and the
	// flags a scan lists it with, for its state key (diffstate.go).
	dirs map[string][]string
	kept map[string]keptDir
	// stateKey is the target's state key as Verify computed it (zero:
	// unknown).
	stateKey delta.ID
	// idsAgree says whether a tree's ID and its hash under opts.IDs
	// were seen to agree (1) or not (-1): the shortcut of stateOf.
	idsAgree int8
	// lower and base are Mountable's: the overlay's lower layer, and how
	// ApplyMounted writes each changed name the lower holds
	// (diffbase.go).
	lower string
	base  map[string]baseHow
}

// Empty reports whether the live state already is the target.
func (p *DiffPlan) Empty() bool { return len(p.changes) == 0 }

// Changes is how many names the plan touches.
func (p *DiffPlan) Changes() int { return len(p.changes) }

// PlanDiff plans turning dst, whose state is the tree live (as scanned), into
// tree target. It reads dst only to stat names it will change.
func PlanDiff(ctx context.Context, dst string, live, target delta.ID, opts DiffOptions) (*DiffPlan, error) {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultDiffMemory
	}
	trees := treeMemoOf(opts.Loader)
	// CheckState and the walk below read the same target trees: once. A
	// caller that checked target already (a CheckedLoader) is not checked
	// again.
	if cl, ok := opts.Loader.(*CheckedLoader); !ok || !cl.passed[checkKey{target, opts.Plain}] {
		cl = NewCheckedLoader(opts.Loader)
		if _, err := cl.CheckState(ctx, target, delta.StateRules{Plain: opts.Plain}); err != nil {
			return nil, fmt.Errorf("tree %s: %w", target.Short(), err)
		}
		opts.Loader = cl
	}
	fd, err := fsat.OpenDir(dst)
	if err != nil {
		return nil, fmt.Errorf("plan restore onto %s: %w", dst, err)
	}
	defer unix.Close(fd)
	p := &DiffPlan{opts: opts, trees: trees, root: dst, target: target, chunks: map[delta.ID][]byte{}, dirs: map[string][]string{}, kept: map[string]keptDir{}}
	if live != target {
		if err := p.dir(ctx, fd, "", live, target, 0, dirFlags{}); err != nil {
			return nil, err
		}
	}
	var need, nodes uint64
	for _, c := range p.changes {
		if c.target != nil && c.how != changeMeta && c.how != changeDirMeta {
			nodes++
			need += c.target.Size
		}
	}
	if err := checkRoom(dst, target, need, nodes); err != nil {
		return nil, err
	}
	return p, nil
}

// checkRoom refuses a write of bytes and nodes the filesystem of dst
// cannot hold.
func checkRoom(dst string, tree delta.ID, bytes, nodes uint64) error {
	var fs unix.Statfs_t
	if err := unix.Statfs(dst, &fs); err != nil {
		return fmt.Errorf("restore into %s: %w", dst, err)
	}
	if free := fs.Bavail * uint64(fs.Bsize); bytes > free {
		return fmt.Errorf("restore into %s: tree %s needs %d bytes, the filesystem has %d free: %w",
			dst, tree.Short(), bytes, free, errdefs.ErrNoSpace)
	}
	if fs.Files > 0 && nodes > fs.Ffree {
		return fmt.Errorf("restore into %s: tree %s needs %d inodes, the filesystem has %d free: %w",
			dst, tree.Short(), nodes, fs.Ffree, errdefs.ErrNoSpace)
	}
	return nil
}

// dir plans directory rel (open as fd, or -1 when it does not exist on
// disk yet) from live tree l to target tree t.
func (p *DiffPlan) dir(ctx context.Context, fd int, rel string, l, t delta.ID, depth int, fl dirFlags) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if depth > delta.MaxDepth {
		return delta.CorruptAt(rel, "directories nested more than %d deep", delta.MaxDepth)
	}
	lt, err := p.tree(ctx, p.opts.Live, l, false)
	if err != nil {
		return fmt.Errorf("live state /%s: %w", rel, err)
	}
	tt, err := p.tree(ctx, p.opts.Loader, t, true)
	if err != nil {
		return fmt.Errorf("/%s: %w", rel, err)
	}
	names := make([]string, len(tt.Entries))
	for i := range tt.Entries {
		names[i] = tt.Entries[i].Name
	}
	p.dirs[rel] = names
	p.kept[rel] = keptDir{flags: fl, entries: tt.Entries, tree: t}
	i, j := 0, 0
	for i < len(lt.Entries) || j < len(tt.Entries) {
		var le, te *delta.Entry
		switch {
		case j == len(tt.Entries) || i < len(lt.Entries) && lt.Entries[i].Name < tt.Entries[j].Name:
			le = &lt.Entries[i]
			i++
		case i == len(lt.Entries) || tt.Entries[j].Name < lt.Entries[i].Name:
			te = &tt.Entries[j]
			j++
		default:
			le, te = &lt.Entries[i], &tt.Entries[j]
			i++
			j++
		}
		if err := p.entry(ctx, fd, path.Join(rel, nameOf(le, te)), le, te, depth, fl); err != nil {
			return err
		}
	}
	return nil
}

func nameOf(a, b *delta.Entry) string {
	if a != nil {
		return a.Name
	}
	return b.Name
}

func (p *DiffPlan) entry(ctx context.Context, dirFD int, rel string, le, te *delta.Entry, depth int, fl dirFlags) error {
	if le != nil && te != nil && sameEntry(le, te) {
		return nil
	}
	if le != nil && le.Type == delta.TypeFile {
		// Changing one name of a multiply-linked file in place would change
		// its other names too; replacing it would leave them on the old
		// inode. Either way the state's other names are not ours to track.
		var st unix.Stat_t
		if err := unix.Fstatat(dirFD, le.Name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("plan /%s: %w", rel, err)
		}
		n := uint64(st.Nlink)
		if p.opts.Names != nil && n > 1 {
			var err error
			if n, err = p.opts.Names(dirFD, le.Name, &st); err != nil {
				return fmt.Errorf("plan /%s: %w", rel, err)
			}
		}
		if n > 1 {
			return fmt.Errorf("/%s has %d names: %w", rel, n, ErrDiffUnsupported)
		}
	}
	switch {
	case te == nil:
		p.changes = append(p.changes, change{rel: rel, remove: true, live: le, opaque: fl.opaque})
		return nil
	case le != nil && le.Type == delta.TypeDir && te.Type == delta.TypeDir:
		fd, err := fsat.Open(dirFD, le.Name, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return fmt.Errorf("plan /%s: %w", rel, err)
		}
		defer unix.Close(fd)
		if p.opts.KeptDir != nil {
			if err := p.opts.KeptDir(dirFD, le.Name, rel); err != nil {
				return fmt.Errorf("plan /%s: %w", rel, err)
			}
		}
		if le.Subtree != te.Subtree {
			if err := p.dir(ctx, fd, rel, le.Subtree, te.Subtree, depth+1, dirFlags{opaque: fl.opaque || te.Opaque}); err != nil {
				return err
			}
		}
		p.changes = append(p.changes, change{rel: rel, live: le, target: te, how: changeDirMeta})
		return nil
	case le != nil && le.Type == delta.TypeFile && te.Type == delta.TypeFile:
		c := change{rel: rel, live: le, target: te, how: changeMeta, opaque: fl.opaque}
		if !delta.SameChunks(le, te) {
			c.how = changeRewrite
			if err := p.load(ctx, te); err != nil {
				return fmt.Errorf("/%s: %w", rel, err)
			}
		}
		p.changes = append(p.changes, c)
		return nil
	case le != nil && le.Type == te.Type && te.Type != delta.TypeSymlink && te.Type != delta.TypeHardlink &&
		te.Type != delta.TypeWhiteout && le.Rdev == te.Rdev:
		p.changes = append(p.changes, change{rel: rel, live: le, target: te, how: changeMeta, opaque: fl.opaque})
		return nil
	}
	if te.Type == delta.TypeDir {
		if err := p.subtree(ctx, rel, te.Subtree, depth+1); err != nil {
			return err
		}
	} else if err := p.load(ctx, te); err != nil {
		return fmt.Errorf("/%s: %w", rel, err)
	}
	p.changes = append(p.changes, change{rel: rel, remove: le != nil, live: le, target: te, how: changeCreate, opaque: fl.opaque})
	return nil
}

// subtree loads every chunk a directory created whole needs.
func (p *DiffPlan) subtree(ctx context.Context, rel string, id delta.ID, depth int) error {
	if depth > delta.MaxDepth {
		return delta.CorruptAt(rel, "directories nested more than %d deep", delta.MaxDepth)
	}
	t, err := p.tree(ctx, p.opts.Loader, id, true)
	if err != nil {
		return fmt.Errorf("/%s: %w", rel, err)
	}
	for i := range t.Entries {
		e := &t.Entries[i]
		crel := path.Join(rel, e.Name)
		if e.Type == delta.TypeDir {
			if err := p.subtree(ctx, crel, e.Subtree, depth+1); err != nil {
				return err
			}
		} else if err := p.load(ctx, e); err != nil {
			return fmt.Errorf("/%s: %w", crel, err)
		}
	}
	return nil
}

// load reads (and so verifies) a file entry's chunks into the plan, and
// checks they add up to the entry's data size: a file the writes would
// find short or long is refused here, before anything is written.
func (p *DiffPlan) load(ctx context.Context, e *delta.Entry) error {
	if e.Type != delta.TypeFile {
		return nil
	}
	if !e.Resolved() {
		return delta.UnresolvedError(e)
	}
	var sum uint64
	for _, c := range e.Chunks {
		if data, ok := p.chunks[c]; ok {
			sum += uint64(len(data))
			continue
		}
		data, err := p.opts.Loader.LoadBlob(ctx, delta.BlobData, c)
		if err != nil {
			return fmt.Errorf("chunk %s: %w", c.Short(), err)
		}
		p.held += int64(len(data))
		if p.held > p.opts.MaxBytes {
			return fmt.Errorf("the diff needs more than %d bytes of chunks: %w", p.opts.MaxBytes, ErrDiffUnsupported)
		}
		p.chunks[c] = data
		sum += uint64(len(data))
	}
	return delta.CheckFileSize(e, sum)
}

// LoadBlob serves the plan's chunks and the target's trees, so Apply
// reads nothing it did not check first.
func (p *DiffPlan) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	if t == delta.BlobData {
		if data, ok := p.chunks[id]; ok {
			return data, nil
		}
		return nil, fmt.Errorf("chunk %s is not in the plan: %w", id.Short(), errdefs.ErrCorrupt)
	}
	return p.opts.Loader.LoadBlob(ctx, t, id)
}

// sameEntry reports whether two entries encode alike.
func sameEntry(a, b *delta.Entry) bool {
	return a.Name == b.Name && a.Type == b.Type && a.Mode == b.Mode && a.UID == b.UID && a.GID == b.GID &&
		a.MtimeNs == b.MtimeNs && a.Size == b.Size && a.Target == b.Target && a.Rdev == b.Rdev &&
		a.Opaque == b.Opaque && a.Subtree == b.Subtree && delta.SameChunks(a, b) &&
		slices.EqualFunc(a.Xattrs, b.Xattrs, func(x, y delta.Xattr) bool { return x.Name == y.Name && string(x.Value) == string(y.Value) })
}

// splitRel returns rel's directory and last component.
func splitRel(rel string) (string, string) {
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		return rel[:i], rel[i+1:]
	}
	return "", rel
}

// CheckedLoader loads each tree from next once (trees are small: a few KiB
// per hundred entries; data blobs pass through) and remembers which trees
// passed CheckState through it. A caller that checks a target itself (for
// its footprint) hands the loader to PlanDiff, which then neither checks
// nor decodes that state a second time.
type CheckedLoader struct {
	next   delta.BlobLoader
	trees  map[delta.ID][]byte
	passed map[checkKey]bool
}

type checkKey struct {
	tree  delta.ID
	plain bool
}

// NewCheckedLoader returns a CheckedLoader reading from next.
func NewCheckedLoader(next delta.BlobLoader) *CheckedLoader {
	return &CheckedLoader{next: next, trees: map[delta.ID][]byte{}, passed: map[checkKey]bool{}}
}

// CheckState is the package's CheckState through l; a tree that passes
// with rules that read no pack headers (ChunkSize nil) is remembered.
func (l *CheckedLoader) CheckState(ctx context.Context, tree delta.ID, rules delta.StateRules) (delta.Footprint, error) {
	fp, err := delta.CheckState(ctx, l, tree, rules)
	if err == nil && rules.ChunkSize == nil {
		l.passed[checkKey{tree, rules.Plain}] = true
	}
	return fp, err
}

// Checked records that tree passed CheckState with rules through another
// loader of the same store (a caller's memo of earlier checks: a check
// depends only on the content-addressed trees). PlanDiff then does not
// check it again; the trees and chunks it reads are still verified.
func (l *CheckedLoader) Checked(tree delta.ID, rules delta.StateRules) {
	if rules.ChunkSize == nil {
		l.passed[checkKey{tree, rules.Plain}] = true
	}
}

func (l *CheckedLoader) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	if t != delta.BlobTree {
		return l.next.LoadBlob(ctx, t, id)
	}
	if data, ok := l.trees[id]; ok {
		return data, nil
	}
	data, err := l.next.LoadBlob(ctx, t, id)
	if err == nil {
		l.trees[id] = data
	}
	return data, err
}

// ApplyDiff turns dst from state live into state target in one call:
// PlanDiff, then Apply, Verify and Sync. Callers that must do something
// between the plan and the first write (overlay unmounts the root) call
// the steps themselves.
func ApplyDiff(ctx context.Context, dst string, live, target delta.ID, opts DiffOptions) (*DiffResult, error) {
	plan, err := PlanDiff(ctx, dst, live, target, opts)
	if err != nil {
		return nil, err
	}
	res, err := plan.Apply(ctx)
	if err != nil {
		return res, err
	}
	fresh, err := plan.Verify(ctx, res)
	if err == nil {
		err = plan.Sync(res, fresh)
	}
	if err != nil {
		return res, fmt.Errorf("%w: %w", ErrPartial, err)
	}
	return res, nil
}
