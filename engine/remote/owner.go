package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// Ownership of sandboxes on a shared bucket (docs/STORAGE.md, "Ownership
// and fencing"). The bucket's head object is the truth and push writes it
// conditionally (engine/remote/heads.go); what this file keeps is the
// local view, so that a home refuses at once what the bucket would refuse
// at push, and the explicit takeover, Adopt.

// OwnerOf is the owner this home knows for sb: the one noted in the
// catalog (an adoption, a fence, a rebuild from owner lines), else the
// home that created it. A legacy sandbox (no home) is owned by whoever
// holds it, as before ownership existed.
func OwnerOf(tx *catalog.Tx, sb *delta.Sandbox) (delta.Owner, error) {
	o, found, err := tx.SandboxOwner(sb.Key())
	if err != nil || found {
		return o, err
	}
	return delta.Owner{Home: sb.Home}, nil
}

// MustOwn refuses to change the head of sandbox sb, whose head is head and
// whose known owner is owner (OwnerOf), when another home owns it.
func (e *Home) MustOwn(sb *delta.Sandbox, owner delta.Owner, head delta.ID) error {
	if owner.Home == "" || owner.Home == e.homeID() {
		return nil
	}
	return fmt.Errorf("sandbox %s is owned by home %s (epoch %d), which alone writes its head in the shared bucket; "+
		"continue it here under a new identity with `turnsnap branch %s NEW-NAME`, or take it over with `turnsnap sandbox adopt %s` (fences that home): %w",
		sb.Name, owner.Home, owner.Epoch, head.Short(), sb.Name, errdefs.ErrPrecondition)
}

// AdoptOptions configures Adopt.
type AdoptOptions struct {
	// Force adopts even while the owner's host lease is live: the owner is
	// fenced mid-work, and its turns since its last push stay unpushed.
	Force bool `json:"force,omitempty"`
}

// AdoptReport says what Adopt did.
type AdoptReport struct {
	Sandbox string        `json:"sandbox"`
	Key     string        `json:"sandbox_id"`
	Head    delta.ID      `json:"head"`
	From    delta.Owner   `json:"from"`
	Owner   delta.Owner   `json:"owner"`
	Already bool          `json:"already_owner,omitempty"`
	Lease   *LeaseView    `json:"owner_lease,omitempty"`
	Took    time.Duration `json:"-"`

	localHead delta.ID
}

// LeaseView is a host lease as another host judges it.
type LeaseView struct {
	delta.HostLease
	Live bool          `json:"live"`
	Age  time.Duration `json:"age_ns"`
}

// Adopt takes over a sandbox another home owns: it rewrites the bucket's
// head of the sandbox with this home as owner and the next epoch, on
// condition that the head is still the version it read, so of two homes
// adopting at once exactly one wins, and the old owner's next head write
// is refused by the bucket (it is fenced). The sandbox continues here from
// the bucket's head, its last remotely durable checkpoint. Without Force an
// owner whose host lease is live is not fenced.
func (e *Home) Adopt(ctx context.Context, name delta.SandboxName, o AdoptOptions) (*AdoptReport, error) {
	start := time.Now()
	rem := e.remote()
	if rem == nil {
		return nil, fmt.Errorf("sandbox %s: adopt: %w", name, ErrNoRemote)
	}
	cond, err := upload.AsConditional(rem)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: adopt: %w", name, err)
	}
	rep, cp, err := e.adopt(ctx, cond, string(name), o)
	if err != nil || rep.Already {
		return rep, err
	}
	// This home owns the sandbox now. Its root and local head still hold
	// the head this catalog knew, which the owner may have moved past:
	// bring them to the bucket's head as a rollback does (processes too).
	if rep.localHead != cp.ID {
		if err := e.d.Rollback(ctx, string(name), cp.ID); err != nil {
			return rep, fmt.Errorf("sandbox %s: adopted (epoch %d), but its root is not yet at the adopted head %s (roll back to it): %w",
				name, rep.Owner.Epoch, cp.ID.Short(), err)
		}
	}
	rep.Took = time.Since(start)
	return rep, nil
}

// adopt is Adopt's takeover under the sandbox's operation lock.
func (e *Home) adopt(ctx context.Context, cond upload.Conditional, name string, o AdoptOptions) (*AdoptReport, *delta.Checkpoint, error) {
	done, err := e.d.Op(ctx, delta.SandboxName(name))
	if err != nil {
		return nil, nil, err
	}
	defer done()
	var sb *delta.Sandbox
	var localHead delta.ID
	err = e.view(ctx, func(tx *catalog.Tx) (err error) {
		if sb, err = tx.Sandbox(delta.SandboxName(name)); err != nil {
			return err
		}
		localHead, err = tx.GetRef(delta.RefHead, name)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	key := sb.Key()
	rep := &AdoptReport{Sandbox: name, Key: string(key)}
	if sb.ID == "" {
		return nil, nil, fmt.Errorf("sandbox %s is a legacy sandbox (no id): it has no owner to take over from: %w", name, errdefs.ErrPrecondition)
	}
	headName := delta.HeadObject(delta.SandboxKey(key))
	data, version, err := cond.GetVersion(ctx, headName, delta.MaxSmallObject)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, nil, fmt.Errorf("sandbox %s: its head is not in the bucket (its owner never pushed it), so there is nothing remotely durable to continue from: %w", name, errdefs.ErrPrecondition)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: adopt: %w", name, err)
	}
	target, owner, err := delta.ParseHead(data)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: object %s: %w", name, headName, err)
	}
	if owner.IsZero() {
		owner = delta.Owner{Home: sb.Home}
	}
	rep.From, rep.Head = owner, target
	if owner.Home == e.homeID() {
		rep.Owner, rep.Already = owner, true
		return rep, nil, e.d.Catalog().Update(ctx, func(tx *catalog.Tx) error { return tx.SetSandboxOwner(key, owner) })
	}
	if lv, err := e.HostLease(ctx, owner.Home); err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: owner's lease: %w", name, err)
	} else if lv != nil {
		rep.Lease = lv
		if lv.Live && !o.Force {
			return nil, nil, fmt.Errorf("sandbox %s: its owner, home %s on host %s (pid %d), renewed its lease %s ago (ttl %s): it is alive and working; adopt --force fences it anyway: %w",
				name, owner.Home, lv.Host, lv.PID, lv.Age.Round(time.Second), time.Duration(lv.TTLNs), errdefs.ErrUnavailable)
		}
	}
	// The checkpoint to continue from must be readable here before the
	// owner is fenced: fencing a home and then failing leaves the sandbox
	// with no writer at all.
	var cp *delta.Checkpoint
	if err := e.view(ctx, func(tx *catalog.Tx) (err error) { cp, err = tx.Checkpoint(target); return err }); err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: the bucket's head %s is not in this catalog (run `turnsnap catalog rebuild` first): %w", name, target.Short(), err)
	}
	if cp.SandboxKey() != key && cp.ID != sb.Origin {
		return nil, nil, fmt.Errorf("sandbox %s: the bucket's head %s belongs to another sandbox: %w", name, target.Short(), errdefs.ErrCorrupt)
	}
	next := delta.Owner{Home: e.homeID(), Epoch: owner.Epoch + 1}
	if _, err := cond.PutIf(ctx, headName, delta.EncodeHead(target, next), version); err != nil {
		if errors.Is(err, upload.ErrConditionFailed) {
			return nil, nil, fmt.Errorf("sandbox %s: its head moved while adopting (its owner pushed, or another home adopted it first); read it again and retry: %w", name, err)
		}
		return nil, nil, fmt.Errorf("sandbox %s: adopt: %w", name, err)
	}
	rep.Owner = next
	if err := e.d.Catalog().Update(ctx, func(tx *catalog.Tx) error { return tx.SetSandboxOwner(key, next) }); err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: adopted in the bucket (epoch %d) but not noted here (the next push learns it): %w", name, next.Epoch, err)
	}
	rep.localHead = localHead
	return rep, cp, nil
}

// HostLease reads a home's host lease from the bucket; nil if it has none.
func (e *Home) HostLease(ctx context.Context, home string) (*LeaseView, error) {
	name := delta.HostLeaseName(home)
	rem := e.remote()
	info, err := rem.Stat(ctx, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	data, err := upload.ReadAllMax(ctx, rem, name, delta.MaxSmallObject)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	lv := &LeaseView{}
	if err := json.Unmarshal(data, &lv.HostLease); err != nil {
		// A lease nobody can read protects nothing, but say so.
		e.d.Log.Warn("host lease unreadable", "object", name, "err", err)
		return nil, nil
	}
	now := time.Now()
	lv.Live = lv.HostLease.Live(info.ModTime, now)
	last := lv.Renewed
	if info.ModTime.After(last) {
		last = info.ModTime
	}
	lv.Age = now.Sub(last)
	return lv, nil
}

// RenewLease writes this home's host lease: the daemon calls it every
// ttl/3 so that other homes do not adopt its sandboxes without force.
func (e *Home) RenewLease(ctx context.Context, ttl time.Duration) error {
	rem := e.remote()
	if rem == nil {
		return nil
	}
	host, _ := os.Hostname()
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	l := delta.HostLease{Home: e.homeID(), Host: host, BootID: string(trimNL(boot)), PID: os.Getpid(),
		Renewed: time.Now().UTC(), TTLNs: int64(ttl)}
	data, _ := json.Marshal(l)
	return upload.PutBytes(ctx, rem, delta.HostLeaseName(e.homeID()), data)
}

// ReleaseLease deletes this home's host lease (a daemon shutting down
// cleanly): its sandboxes may then be adopted without force.
func (e *Home) ReleaseLease(ctx context.Context) error {
	rem := e.remote()
	if rem == nil {
		return nil
	}
	return rem.Delete(ctx, delta.HostLeaseName(e.homeID()))
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}
