package node

import (
	"context"
	"fmt"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Holder is the Lease's holderIdentity ("" when released or unset): the
// home id of the daemon registered as the node.
func Holder(l *coordv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// leaseDuration is l's leaseDurationSeconds, or def when unset.
func leaseDuration(l *coordv1.Lease, def time.Duration) time.Duration {
	if l.Spec.LeaseDurationSeconds == nil || *l.Spec.LeaseDurationSeconds <= 0 {
		return def
	}
	return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
}

// acquire makes the Lease ours: at once when it is absent, released, or
// already held by this home (a daemon restarted after a crash); when
// another home holds it, once no renewal has been seen for a whole lease
// duration. Every write carries the resourceVersion it read, so of two
// agents racing for one name exactly one wins.
func (a *Agent) acquire(ctx context.Context) error {
	leases := a.cfg.Client.CoordinationV1().Leases(a.cfg.Namespace)
	name := LeaseName(a.cfg.Node)
	var seenRV string    // the other holder's Lease version we last saw
	var seenAt time.Time // when we first saw that version (our clock)
	warned := false
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		cur, err := leases.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			created, err := leases.Create(ctx, a.newLease(), metav1.CreateOptions{})
			switch {
			case err == nil:
				a.lease = created
				a.cfg.Log.Info("registered the node: Lease created", "holder", a.cfg.HomeID)
				return nil
			case apierrors.IsAlreadyExists(err):
				continue // another agent created it first: read it
			}
		}
		if err != nil {
			a.cfg.Log.Warn("reading the node's Lease failed; retrying", "err", err)
			if err := sleep(ctx, a.renewEvery()); err != nil {
				return err
			}
			continue
		}
		if h := Holder(cur); h != "" && h != a.cfg.HomeID {
			now := time.Now()
			if cur.ResourceVersion != seenRV {
				seenRV, seenAt = cur.ResourceVersion, now
			}
			if wait := leaseDuration(cur, a.cfg.LeaseDuration) - now.Sub(seenAt); wait > 0 {
				if !warned {
					a.cfg.Log.Warn("the node's Lease is held by another home; waiting for it to expire", "holder", h)
					warned = true
				}
				if err := sleep(ctx, min(wait, a.renewEvery())); err != nil {
					return err
				}
				continue
			}
		}
		next := a.take(cur)
		updated, err := leases.Update(ctx, next, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue // it changed since we read it: decide again
		}
		if err != nil {
			a.cfg.Log.Warn("acquiring the node's Lease failed; retrying", "err", err)
			if err := sleep(ctx, a.renewEvery()); err != nil {
				return err
			}
			continue
		}
		a.lease = updated
		a.cfg.Log.Info("registered the node: Lease acquired", "holder", a.cfg.HomeID,
			"previous_holder", Holder(cur), "transitions", deref(updated.Spec.LeaseTransitions))
		return nil
	}
}

// newLease is the Lease as this agent creates it.
func (a *Agent) newLease() *coordv1.Lease {
	l := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName(a.cfg.Node), Namespace: a.cfg.Namespace}}
	var zero int32
	l.Spec.LeaseTransitions = &zero
	return a.take(l)
}

// take is cur made ours: holder, times, duration, endpoint. A change of
// holder counts as a transition; a restart of the same home does not.
func (a *Agent) take(cur *coordv1.Lease) *coordv1.Lease {
	l := cur.DeepCopy()
	l.Labels = mergeLabels(l.Labels, a.labels())
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[AnnotationEndpoint] = a.cfg.Endpoint
	if prev := Holder(cur); prev != a.cfg.HomeID && cur.ResourceVersion != "" {
		n := deref(l.Spec.LeaseTransitions) + 1
		l.Spec.LeaseTransitions = &n
	}
	id := a.cfg.HomeID
	secs := int32(a.cfg.LeaseDuration / time.Second)
	now := metav1.NowMicro()
	l.Spec.HolderIdentity = &id
	l.Spec.LeaseDurationSeconds = &secs
	l.Spec.AcquireTime = &now
	l.Spec.RenewTime = &now
	return l
}

// renew moves the Lease's renewTime to now. A conflict means the Lease
// changed since our last write: if it is still ours (someone annotated
// it), renew on the fresh copy; if another home holds it, ErrLeaseLost.
func (a *Agent) renew(ctx context.Context) error {
	leases := a.cfg.Client.CoordinationV1().Leases(a.cfg.Namespace)
	for range 3 {
		if a.lease == nil {
			return fmt.Errorf("kube node %s: %w (no Lease acquired)", a.cfg.Node, ErrLeaseLost)
		}
		l := a.lease.DeepCopy()
		now := metav1.NowMicro()
		l.Spec.RenewTime = &now
		updated, err := leases.Update(ctx, l, metav1.UpdateOptions{})
		if err == nil {
			a.lease = updated
			return nil
		}
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return fmt.Errorf("kube node %s: renewing the Lease: %w", a.cfg.Node, err)
		}
		cur, gerr := leases.Get(ctx, LeaseName(a.cfg.Node), metav1.GetOptions{})
		if apierrors.IsNotFound(gerr) {
			a.lease = nil
			return fmt.Errorf("kube node %s: the Lease was deleted: %w", a.cfg.Node, ErrLeaseLost)
		}
		if gerr != nil {
			return fmt.Errorf("kube node %s: renewing the Lease: %w", a.cfg.Node, gerr)
		}
		if h := Holder(cur); h != a.cfg.HomeID {
			a.lease = nil
			return fmt.Errorf("kube node %s: holder is now %q: %w", a.cfg.Node, h, ErrLeaseLost)
		}
		a.lease = cur
	}
	return fmt.Errorf("kube node %s: renewing the Lease: it kept changing under us", a.cfg.Node)
}

func deref(p *int32) int32 {
	if p == nil {
		return 0
	}
	return *p
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
