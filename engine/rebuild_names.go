package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// names reads the sandbox descriptions and refs of the store and gives
// each sandbox its label on this home. Sandboxes are identified by their
// key (id, or a legacy sandbox's name), never by name: sandboxes of one
// name on two homes stay two sandboxes. A label is the sandbox's name
// unless a sandbox ranked earlier holds it (legacy sandboxes first, whose
// name is their key, then this home's, then other homes', each oldest
// first); then it is the
// name with ".ID8" appended. A head names its sandbox by key and takes
// that sandbox's label.
func (rb *rebuilder) names(ctx context.Context) ([]*delta.Sandbox, []delta.Ref, error) {
	e := rb.e
	// A sandbox removed here whose removal has not reached the bucket yet
	// is still there remotely: the old catalog's queue says it is gone.
	deleting := e.pendingDeletes(ctx)
	var sbs []*delta.Sandbox
	err := e.store.List(ctx, delta.SandboxPrefix, func(oi upload.ObjectInfo) error {
		if deleting[oi.Name] {
			return nil
		}
		data, err := upload.ReadAllMax(ctx, e.store, oi.Name, delta.MaxSmallObject)
		if err != nil {
			return err
		}
		sb, err := decodeSandboxObject(oi.Name, data)
		if err != nil {
			return rb.bad(oi.Name, err)
		}
		sbs = append(sbs, sb)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("rebuild: sandboxes: %w", err)
	}
	rank := func(sb *delta.Sandbox) int {
		switch {
		case sb.ID == "":
			return 0 // a legacy sandbox's name is its key: it cannot move
		case sb.Home != "" && sb.Home == e.config.HomeID:
			return 1
		}
		return 2
	}
	slices.SortFunc(sbs, func(a, b *delta.Sandbox) int {
		return cmp.Or(cmp.Compare(rank(a), rank(b)), a.Created.Compare(b.Created), cmp.Compare(a.Key(), b.Key()))
	})
	byKey := map[string]*delta.Sandbox{}
	taken := map[string]bool{}
	for _, sb := range sbs {
		if taken[sb.Name] {
			if sb.ID == "" {
				// Cannot happen (one object per legacy name), but never merge.
				continue
			}
			sb.Name = sb.Name[:min(len(sb.Name), delta.MaxNameLen-9)] + "." + sb.ID[:8]
		}
		taken[sb.Name] = true
		byKey[sb.Key()] = sb
	}
	var refs []delta.Ref
	for _, k := range []struct {
		kind   delta.RefKind
		prefix string
	}{{delta.RefHead, delta.HeadPrefix}, {delta.RefTag, delta.TagPrefix}} {
		err = e.store.List(ctx, k.prefix, func(oi upload.ObjectInfo) error {
			if deleting[oi.Name] {
				return nil
			}
			data, err := upload.ReadAllMax(ctx, e.store, oi.Name, delta.MaxSmallObject)
			if err != nil {
				return err
			}
			id, err := delta.ParseRef(data)
			if err != nil {
				return rb.bad(oi.Name, err)
			}
			name := strings.TrimPrefix(oi.Name, k.prefix)
			if k.kind == delta.RefHead {
				if err := rb.noteOwner(ctx, oi.Name, name); err != nil {
					return err
				}
				sb, ok := byKey[name]
				switch {
				case ok:
					name = sb.Name
				case delta.ValidSandboxID(name):
					return nil // the head of a sandbox removed on its home
				case taken[name]:
					// A legacy head without its description, whose name
					// another sandbox's label holds: it must not move
					// that sandbox's head.
					e.log.Warn("rebuild: ignoring a head whose sandbox is gone", "object", oi.Name)
					return nil
				}
			}
			refs = append(refs, delta.Ref{Kind: k.kind, Name: name, Target: id})
			return nil
		})
		if err != nil {
			return nil, nil, fmt.Errorf("rebuild: refs: %w", err)
		}
	}
	return sbs, refs, nil
}

func decodeSandboxObject(name string, data []byte) (*delta.Sandbox, error) {
	return delta.DecodeSandbox(name, data)
}

// noteOwner reads the owner line of the bucket's head of sandbox key (the
// local copy has none: only the bucket's head carries its writer).
func (rb *rebuilder) noteOwner(ctx context.Context, object, key string) error {
	if rb.e.remote == nil || !delta.ValidSandboxID(key) {
		return nil
	}
	data, err := upload.ReadAllMax(ctx, rb.e.remote, object, delta.MaxSmallObject)
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
