package fstree

import (
	"context"
	"fmt"
	"path"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// A diff is planned on an overlay's upper directory, and applying it there
// needs the overlay unmounted: overlayfs forbids changing its layers under
// a mount. Unmounting and mounting again cost a rollback a few files away
// more than the rest of it together (a new superblock, the index checked,
// the change tracker started again). Many diffs need no such care: when
// every name a diff creates, rewrites or removes is absent from the lower
// layer, the overlay maps each of those names straight to the same name
// in the upper, so writing through the mount makes exactly the upper
// changes the plan lists, and overlay keeps its own bookkeeping (index,
// impure markers) as for any write a process makes. Names the lower holds
// follow the rules of diffbase.go. Mountable says when a plan is such a
// diff; ApplyMounted applies it through the mount.

// Mountable reports whether the plan can be applied through an overlay
// mount of the directory it was planned on (ApplyMounted): "" if it can,
// else why not. lower is the overlay's (only) lower layer.
//
// The rules, each a case where the mount would not write what the plan
// lists:
//   - A name the lower holds, unless baseRule (diffbase.go) finds a way
//     to write it through the mount whose result is exact: a restore that
//     brings a base file back writes a copy of it (the merged view is
//     exact, the upper keeps a copy equal to the lower), one that deletes
//     or replaces a base file unlinks it through the mount first (overlay
//     leaves the whiteout the target holds). Base directories removed or
//     restored, hardlinked or sparse base files, and anything below an
//     opaque directory are left to the unmounted path. Directories kept
//     with new metadata are the exception: they are in the upper already
//     (the live tree has them), so the mount sets their metadata there.
//   - An opaque marker or a whiteout to create, change or remove,
//     anywhere in a subtree created or removed whole: those are overlay's
//     own on-disk forms, which the mount neither shows nor writes.
func (p *DiffPlan) Mountable(ctx context.Context, lower string) (string, error) {
	lowerFD, err := fsat.OpenDir(lower)
	if err != nil {
		return "", fmt.Errorf("lower layer: %w", err)
	}
	defer unix.Close(lowerFD)
	// p.base is set only when every change passed: a plan refused here
	// is applied unmounted, where no base rule applies.
	p.lower, p.base = lower, nil
	base := map[string]baseHow{}
	var copyBytes int64
	for i := range p.changes {
		c := &p.changes[i]
		if c.how == changeDirMeta {
			if c.live == nil || c.live.Opaque != c.target.Opaque {
				return fmt.Sprintf("/%s changes its opaque marker", c.rel), nil
			}
			continue
		}
		b, err := baseAt(lowerFD, c.rel)
		if err != nil {
			return "", fmt.Errorf("/%s: %w", c.rel, err)
		}
		if b.present {
			how, why := baseRule(c, b)
			if why != "" {
				return fmt.Sprintf("/%s is in the lower layer: %s", c.rel, why), nil
			}
			switch how {
			case baseDir:
				n, why, err := p.baseDirRule(ctx, p.opts.Live, lowerFD, c.rel, c.live, 0, true)
				if why != "" || err != nil {
					return why, err
				}
				b.size = n
			case baseDirOver:
				if _, why, err := p.baseDirRule(ctx, p, lowerFD, c.rel, c.target, 0, false); why != "" || err != nil {
					return why, err
				}
			}
			if how == baseCopy || how == baseDir {
				if copyBytes += b.size; copyBytes > MaxBaseCopyBytes {
					return fmt.Sprintf("the base files to copy back exceed %d bytes", MaxBaseCopyBytes), nil
				}
			}
			if how != baseInPlace {
				base[c.rel] = how
			}
			continue // the rule checked every form the change writes
		}
		if c.remove {
			if why, err := overlayForms(ctx, p.opts.Live, c.live, c.rel, 0); why != "" || err != nil {
				return why, err
			}
		}
		if c.target != nil && c.how == changeCreate {
			if why, err := overlayForms(ctx, p, c.target, c.rel, 0); why != "" || err != nil {
				return why, err
			}
		}
	}
	p.base = base
	return "", nil
}

// overlayForms says where e (at rel), or its subtree read through l,
// holds a whiteout or an opaque directory ("" if nowhere).
func overlayForms(ctx context.Context, l delta.BlobLoader, e *delta.Entry, rel string, depth int) (string, error) {
	switch {
	case e == nil:
		return "", nil
	case e.Type == delta.TypeWhiteout:
		return fmt.Sprintf("/%s is a whiteout", rel), nil
	case e.Type != delta.TypeDir:
		return "", nil
	case e.Opaque:
		return fmt.Sprintf("/%s is an opaque directory", rel), nil
	case depth > delta.MaxDepth:
		return "", delta.CorruptAt(rel, "directories nested more than %d deep", delta.MaxDepth)
	}
	t, err := delta.LoadTree(ctx, l, e.Subtree)
	if err != nil {
		return "", fmt.Errorf("/%s: %w", rel, err)
	}
	for i := range t.Entries {
		if why, err := overlayForms(ctx, l, &t.Entries[i], path.Join(rel, t.Entries[i].Name), depth+1); why != "" || err != nil {
			return why, err
		}
	}
	return "", nil
}

// ApplyMounted is Apply writing through mount, an overlay mount whose
// upper is the directory the plan was planned on, for a plan Mountable
// passed. Verify and Sync then read and sync the upper as after Apply.
// Nothing may write to the mount meanwhile but ApplyMounted (the caller
// has stopped the sandbox's processes, as for Apply).
func (p *DiffPlan) ApplyMounted(ctx context.Context, mount string) (*DiffResult, error) {
	return p.applyAt(ctx, mount, true)
}
