package retention

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// ForgetCheckpoint deletes one checkpoint, as Forget deletes what a policy
// drops: never a head, a tagged checkpoint, one another sandbox continues
// from or one a ref in the bucket names (refused as a precondition, with
// the reasons), and only a checkpoint of a sandbox this home may prune.
// With a remote the record is marked for grace first (see Forget); earlier
// marks of the same sandbox are left as they are, since this run decides
// nothing about the sandbox's other checkpoints. The snapshot provider's
// Delete (package kube/snapshot) is its caller.
func (rt *Retention) ForgetCheckpoint(ctx context.Context, id delta.ID, grace time.Duration) (*ForgetReport, error) {
	defer rt.d.Exclusive()()
	o := rt.op()
	h, err := o.d.LoadHistory(ctx)
	if err != nil {
		return nil, err
	}
	var cp *delta.Checkpoint
	var key string
	for k, cps := range h.BySandbox {
		for _, c := range cps {
			if c.ID == id {
				cp, key = c, k
			}
		}
	}
	if cp == nil {
		return nil, fmt.Errorf("checkpoint %s: %w", id, errdefs.ErrNotFound)
	}
	if !h.mayPrune(key) {
		return nil, fmt.Errorf("checkpoint %s is of sandbox %s, created by another home sharing the bucket; only that home deletes its checkpoints: %w",
			id.Short(), h.label(cp), errdefs.ErrPrecondition)
	}
	if err := o.addBucketPins(ctx, h); err != nil {
		return nil, fmt.Errorf("forget checkpoint %s: %w", id.Short(), err)
	}
	if why := h.Pin[id]; len(why) > 0 {
		return nil, fmt.Errorf("checkpoint %s of sandbox %s is kept (%s): %w",
			id.Short(), h.label(cp), strings.Join(why, ", "), errdefs.ErrPrecondition)
	}
	e := Entry{ID: cp.ID, Sandbox: h.label(cp), Turn: cp.Turn, Created: cp.Created}
	r, err := o.retire(ctx, h, []*delta.Checkpoint{cp}, map[string]bool{}, grace, false)
	rep := &ForgetReport{Sandboxes: []ForgetSandbox{}, Swept: []Entry{}}
	if r == nil {
		return rep, err
	}
	r.report(rep, h, []forgetPart{{sandbox: e.Sandbox, dropped: []Entry{e}}})
	return rep, err
}
