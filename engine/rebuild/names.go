package rebuild

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// descriptions reads the sandbox descriptions of the store, by key. One
// that does not decode, or describes a sandbox other than the one its
// object name says (an impostor), is skipped as corrupt.
func (rb *run) descriptions(ctx context.Context, deleting map[string]bool) (map[string]*delta.Sandbox, error) {
	byKey := map[string]*delta.Sandbox{}
	err := rb.store.List(ctx, delta.SandboxPrefix, func(oi upload.ObjectInfo) error {
		if deleting[oi.Name] {
			return nil
		}
		data, found, err := rb.readSmall(ctx, oi.Name, delta.MaxSmallObject)
		if !found {
			return err
		}
		sb, err := delta.DecodeSandbox(oi.Name, data)
		if err != nil {
			return rb.bad(oi.Name, err)
		}
		byKey[string(sb.Key())] = sb
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rebuild: sandboxes: %w", err)
	}
	return byKey, nil
}

// readRef reads and parses a listed head or tag; found is false when it is
// gone or was skipped.
func (rb *run) readRef(ctx context.Context, name string) (delta.ID, bool, error) {
	data, found, err := rb.readSmall(ctx, name, delta.MaxSmallObject)
	if !found {
		return delta.ID{}, false, err
	}
	id, err := delta.ParseRef(data)
	if err != nil {
		return delta.ID{}, false, rb.bad(name, err)
	}
	return id, true, nil
}

// refTarget checks that ref object name may point at target: an indexed
// (whole) checkpoint. Otherwise the ref is skipped, dangling when the store
// has no such record, with the record's own class when it was not whole.
func (rb *run) refTarget(name, sandbox string, target delta.ID, indexed map[delta.ID]*delta.Checkpoint, notWhole map[delta.ID]SkippedObject) (bool, error) {
	if _, ok := indexed[target]; ok {
		return true, nil
	}
	if s, ok := notWhole[target]; ok {
		return false, rb.skip(name, s.Class, sandbox, fmt.Errorf("object %s: names checkpoint %s, which cannot be restored: %s", name, target.Short(), s.Error))
	}
	return false, rb.skip(name, SkipDangling, sandbox, fmt.Errorf("object %s: names checkpoint %s, which the store lacks (or holds damaged)", name, target.Short()))
}

// names decides which sandboxes the rebuild restores and gives each its
// label on this home, and reads the refs.
//
// A sandbox is restored when its head names a whole checkpoint over the
// sandbox's base. A sandbox whose head is missing, dangles or names a
// checkpoint that is not whole is skipped (reported under its head object,
// or its description when it has no head); its whole checkpoints are still
// indexed, so `log --all` lists them and `branch` and `verify` take them.
// A sandbox the old catalog has, with a head the store holds whole, keeps
// that head instead (still reported): this home's root of it is there.
//
// Sandboxes are identified by their key (id, or a legacy sandbox's name),
// never by name: sandboxes of one name on two homes stay two sandboxes. A
// label is the sandbox's name unless a sandbox ranked earlier holds it
// (legacy sandboxes first, whose name is their key, then this home's, then
// other homes', each oldest first); then it is the name with ".ID8"
// appended. A head names its sandbox by key and takes that sandbox's label.
func (rb *run) names(ctx context.Context, deleting map[string]bool, byKey map[string]*delta.Sandbox,
	indexed map[delta.ID]*delta.Checkpoint, notWhole map[delta.ID]SkippedObject) ([]*delta.Sandbox, []delta.Ref, error) {
	log := rb.r.d.Log
	heads := map[string]delta.ID{} // sandbox key → head, for the sandboxes restored
	headSeen := map[string]bool{}  // sandbox keys whose head object was read (or skipped)
	type legacyHead struct {
		object, name string
		target       delta.ID
	}
	var orphans []legacyHead
	err := rb.store.List(ctx, delta.HeadPrefix, func(oi upload.ObjectInfo) error {
		if deleting[oi.Name] {
			return nil
		}
		key := strings.TrimPrefix(oi.Name, delta.HeadPrefix)
		sb, described := byKey[key]
		label := ""
		if described {
			label = string(sb.Name)
			headSeen[key] = true
		}
		id, found, err := rb.readRef(ctx, oi.Name)
		if !found {
			return err
		}
		if described {
			if err := rb.noteOwner(ctx, oi.Name, key); err != nil {
				return err
			}
		}
		switch {
		case !described && delta.ValidSandboxID(key):
			return nil // the head of a sandbox removed on its home
		case !described:
			orphans = append(orphans, legacyHead{oi.Name, key, id})
			return nil
		}
		ok, err := rb.refTarget(oi.Name, label, id, indexed, notWhole)
		if !ok {
			return err
		}
		if cp := indexed[id]; cp.BaseTree != sb.BaseTree {
			return rb.bad(oi.Name, fmt.Errorf("object %s: head of sandbox %s names checkpoint %s over base %s, not the sandbox's %s",
				oi.Name, sb.Name, id.Short(), cp.BaseTree.Short(), sb.BaseTree.Short()))
		}
		heads[key] = id
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("rebuild: refs: %w", err)
	}
	old := rb.oldHeads(ctx)
	var sbs []*delta.Sandbox
	for key, sb := range byKey {
		if _, ok := heads[key]; ok {
			sbs = append(sbs, sb)
			continue
		}
		if !headSeen[key] {
			err := rb.skip(delta.SandboxObject(delta.SandboxKey(key)), SkipMissingObjects, string(sb.Name),
				fmt.Errorf("sandbox %s: the store holds no head for it (%s)", sb.Name, delta.HeadObject(delta.SandboxKey(key))))
			if err != nil {
				return nil, nil, err
			}
		}
		// A sandbox this home has, whose head the old catalog knows and the
		// store holds whole, keeps that head: its root here is at that
		// checkpoint, and dropping the sandbox would orphan it.
		if id, ok := old[key]; ok && indexed[id] != nil && indexed[id].BaseTree == sb.BaseTree {
			log.Warn("rebuild: keeping this home's head of a sandbox whose stored head is unusable", "sandbox", sb.Name, "head", id)
			for i, sk := range rb.rep.Skipped {
				if sk.Name == delta.HeadObject(delta.SandboxKey(key)) || sk.Name == delta.SandboxObject(delta.SandboxKey(key)) {
					rb.rep.Skipped[i].Error += fmt.Sprintf("; this home's head of it, %s, is kept", id.Short())
				}
			}
			heads[key] = id
			sbs = append(sbs, sb)
		}
	}
	homeID := rb.r.d.HomeID()
	rank := func(sb *delta.Sandbox) int {
		switch {
		case sb.ID == "":
			return 0 // a legacy sandbox's name is its key: it cannot move
		case sb.Home != "" && sb.Home == homeID:
			return 1
		}
		return 2
	}
	slices.SortFunc(sbs, func(a, b *delta.Sandbox) int {
		return cmp.Or(cmp.Compare(rank(a), rank(b)), a.Created.Compare(b.Created), cmp.Compare(a.Key(), b.Key()))
	})
	taken := map[string]bool{}
	var refs []delta.Ref
	kept := sbs[:0]
	for _, sb := range sbs {
		if taken[string(sb.Name)] {
			if sb.ID == "" {
				// Cannot happen (one object per legacy name), but never merge.
				continue
			}
			sb.Name = sb.Name[:min(len(sb.Name), delta.MaxNameLen-9)] + delta.SandboxName("."+sb.ID[:8])
		}
		taken[string(sb.Name)] = true
		kept = append(kept, sb)
		refs = append(refs, delta.Ref{Kind: delta.RefHead, Name: string(sb.Name), Target: heads[string(sb.Key())]})
	}
	for _, h := range orphans {
		switch {
		case taken[h.name]:
			// A legacy head without its description, whose name another
			// sandbox's label holds: it must not move that sandbox's head.
			log.Warn("rebuild: ignoring a head whose sandbox is gone", "object", h.object)
			continue
		case !delta.ValidRefName(h.name):
			if err := rb.bad(h.object, fmt.Errorf("object %s: %q is not a valid sandbox name", h.object, h.name)); err != nil {
				return nil, nil, err
			}
			continue
		}
		if ok, err := rb.refTarget(h.object, h.name, h.target, indexed, notWhole); !ok {
			if err != nil {
				return nil, nil, err
			}
			continue
		}
		refs = append(refs, delta.Ref{Kind: delta.RefHead, Name: h.name, Target: h.target})
	}
	err = rb.store.List(ctx, delta.TagPrefix, func(oi upload.ObjectInfo) error {
		if deleting[oi.Name] {
			return nil
		}
		name := strings.TrimPrefix(oi.Name, delta.TagPrefix)
		if !delta.ValidRefName(name) {
			return rb.bad(oi.Name, fmt.Errorf("object %s: %q is not a valid tag name", oi.Name, name))
		}
		id, found, err := rb.readRef(ctx, oi.Name)
		if !found {
			return err
		}
		if ok, err := rb.refTarget(oi.Name, "", id, indexed, notWhole); !ok {
			return err
		}
		refs = append(refs, delta.Ref{Kind: delta.RefTag, Name: name, Target: id})
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("rebuild: refs: %w", err)
	}
	return kept, refs, nil
}

// oldHeads reads the old catalog's sandbox heads by sandbox key; an
// unreadable or absent old catalog gives none.
func (rb *run) oldHeads(ctx context.Context) map[string]delta.ID {
	out := map[string]delta.ID{}
	old := rb.r.d.Catalog()
	if old == nil {
		return out
	}
	err := old.View(ctx, func(tx *catalog.Tx) error {
		sbs, err := tx.Sandboxes()
		for _, sb := range sbs {
			if id, err := tx.GetRef(delta.RefHead, string(sb.Name)); err == nil {
				out[string(sb.Key())] = id
			}
		}
		return err
	})
	if err != nil {
		rb.r.d.Log.Warn("rebuild: old catalog's heads unreadable", "err", err)
	}
	return out
}

// noteOwner reads the owner line of the bucket's head of sandbox key (the
// local copy has none: only the bucket's head carries its writer).
func (rb *run) noteOwner(ctx context.Context, object, key string) error {
	if rb.remote == nil || !delta.ValidSandboxID(key) {
		return nil
	}
	data, err := upload.ReadAllMax(ctx, rb.remote, object, delta.MaxSmallObject)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil // not pushed yet: its creator owns it
	}
	if err != nil {
		return err
	}
	_, o, err := delta.ParseHead(data)
	if err != nil {
		return rb.bad(object, err)
	}
	if !o.IsZero() {
		if rb.owners == nil {
			rb.owners = map[string]delta.Owner{}
		}
		rb.owners[key] = o
	}
	return nil
}
