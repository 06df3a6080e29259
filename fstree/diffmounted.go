package fstree

import (
	"context"
	"fmt"
	"github.com/turnsnap/turnsnap/delta"
	"path"
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
// impure markers) as for any write a process makes. Mountable says when a
// plan is such a diff; ApplyMounted applies it through the mount.

// Mountable reports whether the plan can be applied through an overlay
// mount of the directory it was planned on (ApplyMounted): "" if it can,
// else why not. inLower reports whether a root-relative path exists in
// the overlay's lower layers; it must answer true whenever it cannot tell.
//
// The rules, each a case where the mount would not write what the plan
// lists:
//   - A name (created, rewritten, given metadata or removed) that the
//     lower holds: through the mount a removal leaves a whiteout, a
//     rewrite of a lower file copies it up, and a restore that brings a
//     lower file back means removing upper entries the mount hides.
//     Directories kept with new metadata are the exception: they are in
//     the upper already (the live tree has them), so the mount sets their
//     metadata there.
//   - An opaque marker or a whiteout to create, change or remove,
//     anywhere in a subtree created or removed whole: those are overlay's
//     own on-disk forms, which the mount neither shows nor writes.
func (p *DiffPlan) Mountable(ctx context.Context, inLower func(rel string) (bool, error)) (string, error) {
	for i := range p.changes {
		c := &p.changes[i]
		if c.how == changeDirMeta {
			if c.live == nil || c.live.Opaque != c.target.Opaque {
				return fmt.Sprintf("/%s changes its opaque marker", c.rel), nil
			}
			continue
		}
		in, err := inLower(c.rel)
		if err != nil {
			return "", fmt.Errorf("/%s: %w", c.rel, err)
		}
		if in {
			return fmt.Sprintf("/%s is in the lower layer", c.rel), nil
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
