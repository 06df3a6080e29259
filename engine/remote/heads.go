package remote

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// Fenced head writes (docs/STORAGE.md, "Ownership and fencing"). A head in
// the bucket names its owner (delta.Owner); push writes it only as that
// owner and only over the version it just read (upload.Conditional), so a
// home that another home adopted a sandbox from is refused by the bucket
// itself however its view lags: between its read and its write the
// adoption changed the object, and the conditional write fails.

// ErrFenced is the class of a head write refused because another home owns
// the sandbox now.
var ErrFenced = fmt.Errorf("fenced: another home owns this sandbox now: %w", errdefs.ErrPrecondition)

// errHeadAhead: the local head names a record this push did not carry
// (committed after the push chose its uploads); the head stays queued.
var errHeadAhead = errors.New("head ahead of the push")

// headRetries bounds the read-and-write rounds of one head write: each
// round that loses is another writer's success, and the owner is the only
// writer, so a second loss in a row already means something is wrong.
const headRetries = 3

// writeHead uploads the local head p (refs/heads/KEY) as its owner.
func (e *Syncer) writeHead(ctx context.Context, p job) error {
	key := delta.SandboxKey(strings.TrimPrefix(p.Name, delta.HeadPrefix))
	data, err := upload.ReadAllMax(ctx, e.Local, p.Name, delta.MaxSmallObject)
	if err != nil {
		return fmt.Errorf("queued upload %s: %w", p.Name, err)
	}
	target, _, err := delta.ParseHead(data)
	if err != nil {
		return fmt.Errorf("object %s (local): %w", p.Name, err)
	}
	cond, err := upload.AsConditional(e.Remote)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", p.Sandbox, err)
	}
	// The head is read now, not when it was queued: a commit since may
	// have moved it to a record not in the bucket yet. A head never goes
	// up before its record; that commit queued the head again. The record
	// refTargets checked for this push needs no second look.
	if target != p.checked {
		if _, err := e.Remote.Stat(ctx, delta.RecordName(target)); errors.Is(err, errdefs.ErrNotFound) {
			return errHeadAhead
		} else if err != nil {
			return fmt.Errorf("sandbox %s: %w", p.Sandbox, err)
		}
	}
	for range headRetries {
		cur, version, err := cond.GetVersion(ctx, p.Name, delta.MaxSmallObject)
		var have delta.Owner
		var haveTarget delta.ID
		switch {
		case errors.Is(err, errdefs.ErrNotFound):
			version = ""
		case err != nil:
			return fmt.Errorf("sandbox %s: %w", p.Sandbox, err)
		default:
			if haveTarget, have, err = delta.ParseHead(cur); err != nil {
				return fmt.Errorf("sandbox %s: object %s: %w", p.Sandbox, p.Name, err)
			}
		}
		me, err := e.headOwner(ctx, key, have, version != "")
		if err != nil {
			if errors.Is(err, ErrFenced) {
				// Remember it: the home refuses the sandbox's turns from
				// now on, and the head leaves the queue (it can never be
				// pushed, and must not block the others).
				// Its checkpoints were never accepted as the sandbox's
				// turns: they must not be reported remotely durable,
				// although their records may be in the bucket.
				if uerr := e.Cat.Update(ctx, func(tx *catalog.Tx) error {
					if err := tx.SetSandboxOwner(key, have); err != nil {
						return err
					}
					for _, c := range p.covers {
						if !c.Checkpoint.IsZero() {
							if err := tx.NoteFenced(c.Checkpoint); err != nil {
								return err
							}
						}
					}
					return DoneAll(tx, p.covers)
				}); uerr != nil {
					err = errors.Join(err, uerr)
				}
				e.Log.Warn("sandbox fenced: its head was not pushed", "sandbox", p.Sandbox, "key", key, "owner", have.Home, "epoch", have.Epoch, "head", target.Short())
				return fmt.Errorf("sandbox %s: home %s adopted it (epoch %d); this home's head %s was not pushed (its checkpoints stay here: `turnsnap branch %s NEW-NAME` keeps them going): %w",
					p.Sandbox, have.Home, have.Epoch, target.Short(), target.Short(), err)
			}
			return err
		}
		if version != "" && haveTarget == target && have == me {
			return nil // already there (an earlier push whose answer was lost)
		}
		if _, err := cond.PutIf(ctx, p.Name, delta.EncodeHead(target, me), version); err != nil {
			if errors.Is(err, upload.ErrConditionFailed) {
				continue // moved since the read: judge the new version
			}
			return fmt.Errorf("sandbox %s: %w", p.Sandbox, err)
		}
		return nil
	}
	return fmt.Errorf("sandbox %s: head %s kept changing under %d conditional writes: %w", p.Sandbox, p.Name, headRetries, errdefs.ErrUnavailable)
}

// headOwner decides as whom this home writes the head of sandbox key, given
// the owner line of the bucket's head (zero when the bucket has none, or
// no head: exists says which). It is ErrFenced when another home owns it.
func (e *Syncer) headOwner(ctx context.Context, key delta.SandboxKey, have delta.Owner, exists bool) (delta.Owner, error) {
	if have.Home == e.HomeID {
		return have, nil
	}
	if have.Home != "" {
		return delta.Owner{}, ErrFenced
	}
	// No owner line: the bucket's head predates ownership, or there is no
	// head yet. The owner is the home that created the sandbox, unless
	// this home noted another (an adoption it lost, or one it made of a
	// head that carried no line).
	var creator string
	var noted delta.Owner
	var found bool
	err := e.Cat.View(ctx, func(tx *catalog.Tx) error {
		sbs, err := tx.Sandboxes()
		if err != nil {
			return err
		}
		for _, sb := range sbs {
			if sb.Key() == key {
				creator = sb.Home
			}
		}
		noted, found, err = tx.SandboxOwner(key)
		return err
	})
	if err != nil {
		return delta.Owner{}, err
	}
	switch {
	case found && noted.Home == e.HomeID:
		return noted, nil
	case found && noted.Home != "":
		return delta.Owner{}, ErrFenced
	case creator == "" && !delta.ValidSandboxID(string(key)):
		return delta.Owner{}, nil // a legacy sandbox: no owner, as before
	case creator == e.HomeID || creator == "" && !exists:
		return delta.Owner{Home: e.HomeID, Epoch: 1}, nil
	}
	return delta.Owner{}, ErrFenced
}

// mayDelete reports whether this home may delete the bucket's head or
// description of sandbox key (a sandbox removed here): only its owner may.
// A home that dropped another home's sandbox from its catalog leaves the
// bucket's objects alone.
func (e *Syncer) mayDelete(ctx context.Context, name string) (bool, error) {
	var key string
	switch {
	case strings.HasPrefix(name, delta.HeadPrefix):
		key = strings.TrimPrefix(name, delta.HeadPrefix)
	case strings.HasPrefix(name, delta.SandboxPrefix):
		key = strings.TrimPrefix(name, delta.SandboxPrefix)
	default:
		return true, nil
	}
	if !delta.ValidSandboxID(key) {
		return true, nil // legacy: no owner
	}
	head := delta.HeadObject(delta.SandboxKey(key))
	data, err := upload.ReadAllMax(ctx, e.Remote, head, delta.MaxSmallObject)
	if errors.Is(err, errdefs.ErrNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	_, o, err := delta.ParseHead(data)
	if err != nil {
		return false, fmt.Errorf("object %s: %w", head, err)
	}
	if o.Home != "" {
		return o.Home == e.HomeID, nil
	}
	desc, err := upload.ReadAllMax(ctx, e.Remote, delta.SandboxObject(delta.SandboxKey(key)), delta.MaxSandboxObject)
	if errors.Is(err, errdefs.ErrNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	sb, err := delta.DecodeSandbox(delta.SandboxObject(delta.SandboxKey(key)), desc)
	if err != nil {
		return false, err
	}
	return sb.Home == "" || sb.Home == e.HomeID, nil
}
