package history

import (
	"context"
	"fmt"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/remote"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// validTagName refuses names that look like checkpoint id prefixes: those
// resolve as ids first, so such a tag could become unreachable; and HEAD,
// which names a sandbox's head (catalog.ParseCheckpointRef).
func validTagName(name string) bool {
	if !delta.ValidRefName(name) || name == "HEAD" {
		return false
	}
	for _, c := range name {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return true
		}
	}
	return false
}

// Tag names checkpoint ref. Tags are refs like heads: stored as objects
// (so a rebuild keeps them) and indexed in the catalog. A tag can be used
// wherever a checkpoint is expected.
func (v *Views) Tag(ctx context.Context, name string, ref catalog.CheckpointRef) (*delta.Checkpoint, error) {
	defer v.d.Shared()()
	if !validTagName(name) {
		return nil, fmt.Errorf("tag name %q: use 1-64 of [A-Za-z0-9._-], not starting with '.' or '-', not only hex digits, not HEAD: %w",
			name, errdefs.ErrInvalid)
	}
	cp, err := v.d.Resolve(ctx, "", ref)
	if err != nil {
		return nil, err
	}
	err = v.d.View(ctx, func(tx *catalog.Tx) error {
		_, err := tx.GetRef(delta.RefTag, name)
		return err
	})
	if err == nil {
		return nil, fmt.Errorf("tag %s: %w", name, errdefs.ErrExists)
	}
	if err := v.d.PutRef(ctx, delta.RefTag, name, cp.ID); err != nil {
		return nil, err
	}
	err = v.d.Update(ctx, func(tx *catalog.Tx) error {
		if err := v.d.Queue.QueueRef(tx, string(cp.Sandbox), delta.RefName(delta.RefTag, name), cp.ID, ""); err != nil {
			return err
		}
		return tx.SetRef(delta.Ref{Kind: delta.RefTag, Name: name, Target: cp.ID})
	})
	if err != nil {
		return nil, fmt.Errorf("tag %s: %w", name, err)
	}
	return cp, nil
}

// Untag deletes a tag (the checkpoint stays).
func (v *Views) Untag(ctx context.Context, name string) error {
	defer v.d.Shared()()
	err := v.d.View(ctx, func(tx *catalog.Tx) error {
		_, err := tx.GetRef(delta.RefTag, name)
		return err
	})
	if err != nil {
		return fmt.Errorf("tag %s: %w", name, err)
	}
	if err := v.d.DeleteLocal(ctx, delta.RefName(delta.RefTag, name)); err != nil {
		return fmt.Errorf("tag %s: %w", name, err)
	}
	return v.d.Update(ctx, func(tx *catalog.Tx) error {
		if err := v.d.Queue.QueueDelete(tx, remote.BackfillSandbox, delta.RefName(delta.RefTag, name)); err != nil {
			return err
		}
		return tx.DeleteRef(delta.RefTag, name)
	})
}

// Tags lists every tag.
func (v *Views) Tags(ctx context.Context) ([]delta.Ref, error) {
	defer v.d.Shared()()
	var refs []delta.Ref
	err := v.d.View(ctx, func(tx *catalog.Tx) error {
		var err error
		refs, err = tx.Refs(delta.RefTag)
		return err
	})
	return refs, err
}
