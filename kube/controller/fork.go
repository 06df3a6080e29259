package controller

import (
	"context"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	ctrl "sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/turnsnap/turnsnap/kube/api/v1alpha1"
)

// LabelFork names, on a fork's children, the SandboxFork that made them.
const LabelFork = "turnsnap.dev/fork"

type forkReconciler struct{ *reconciler }

// childNames are the fork's children, deterministic: a restarted
// controller makes the same names, and finds the children it made.
func childNames(f *v1.SandboxFork) []string {
	if len(f.Spec.Names) > 0 {
		return f.Spec.Names
	}
	out := make([]string, 0, f.Spec.Count)
	for i := 1; i <= int(f.Spec.Count); i++ {
		out = append(out, f.Name+"-"+strconv.Itoa(i))
	}
	return out
}

func (fr *forkReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var f v1.SandboxFork
	if err := fr.live.Get(ctx, req.NamespacedName, &f); err != nil {
		return ctrl.Result{}, ignoreNotFound(err)
	}
	if f.Status.Phase == v1.ForkCompleted || f.Status.Phase == v1.ForkFailed {
		return ctrl.Result{}, nil
	}
	// The fork's status is this reconciler's alone and made whole from the
	// children each time: it is patched, so that the children's many
	// changes do not make it conflict with itself.
	r := &forkPatcher{forkReconciler: fr, orig: f.DeepCopy()}
	st := &f.Status
	if st.StartTime == nil {
		now := metav1.NewTime(r.opts.Now())
		st.StartTime = &now
	}
	// The checkpoint, and which nodes hold its data.
	holds := map[string]int{}
	id, node, why, err := r.resolve(ctx, &f)
	if err != nil {
		return ctrl.Result{}, err
	}
	if id == "" {
		st.Phase = v1.ForkPending
		setCondition(&st.Conditions, f.Generation, ConditionDone, metav1.ConditionFalse, "Waiting", why)
		return ctrl.Result{RequeueAfter: waitRetry}, r.status(ctx, &f)
	}
	st.Checkpoint = id
	if node != "" {
		holds[node] = 2
	}
	names := childNames(&f)
	var kids v1.TurnsnapSandboxList
	if err := r.c.List(ctx, &kids, crclient.InNamespace(f.Namespace), crclient.MatchingLabels{LabelFork: f.Name}); err != nil {
		return ctrl.Result{}, err
	}
	have := map[string]*v1.TurnsnapSandbox{}
	for i := range kids.Items {
		k := &kids.Items[i]
		have[k.Name] = k
		if k.Spec.NodeName != "" {
			holds[k.Spec.NodeName] = max(holds[k.Spec.NodeName], 1) // fetched the data for a sibling
		}
	}
	var missing []string
	for _, name := range names {
		if have[name] == nil {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		st.Phase = v1.ForkForking
		if err := r.status(ctx, &f); err != nil {
			return ctrl.Result{}, err
		}
		if res, err := r.makeChildren(ctx, &f, missing, holds, have); err != nil || !res.IsZero() {
			return res, err
		}
	}
	// Every child exists: report where each is.
	st.Children = st.Children[:0]
	st.Ready = 0
	failed := ""
	for _, name := range names {
		k := have[name]
		ch := v1.ForkChild{Name: name}
		if k != nil {
			ch.Node, ch.Phase, ch.Receipt = k.Status.Node, k.Status.Phase, k.Status.LastRestore
			if ch.Node == "" {
				ch.Node = k.Spec.NodeName
			}
		}
		switch ch.Phase {
		case v1.SandboxRunning:
			st.Ready++
		case v1.SandboxFailed:
			failed = name
		}
		st.Children = append(st.Children, ch)
	}
	switch {
	case failed != "":
		st.Phase, st.Message = v1.ForkFailed, "child "+failed+" failed"
		setCondition(&st.Conditions, f.Generation, ConditionDone, metav1.ConditionFalse, "Failed", st.Message)
		r.events.Eventf(&f, nil, corev1.EventTypeWarning, "Failed", "fork", "%s", st.Message)
	case int(st.Ready) == len(names):
		now := metav1.NewTime(r.opts.Now())
		st.Phase, st.CompletionTime, st.Message = v1.ForkCompleted, &now, ""
		setCondition(&st.Conditions, f.Generation, ConditionDone, metav1.ConditionTrue, "Completed",
			fmt.Sprintf("%d children running", len(names)))
		r.events.Eventf(&f, nil, corev1.EventTypeNormal, "Completed", "fork", "%d children of %s running", len(names), short(st.Checkpoint))
	default:
		st.Phase = v1.ForkForking
		setCondition(&st.Conditions, f.Generation, ConditionDone, metav1.ConditionFalse, "Forking",
			fmt.Sprintf("%d of %d children running", st.Ready, len(names)))
	}
	// Children's changes requeue the fork (it owns them).
	return ctrl.Result{}, r.status(ctx, &f)
}

// resolve returns the checkpoint to fork and the node that took it, or ""
// and why when it is not ready yet.
func (r *forkReconciler) resolve(ctx context.Context, f *v1.SandboxFork) (id, node, why string, err error) {
	if f.Spec.Checkpoint != "" {
		return f.Spec.Checkpoint, "", "", nil
	}
	var cp v1.SandboxCheckpoint
	if err := r.c.Get(ctx, crclient.ObjectKey{Namespace: f.Namespace, Name: f.Spec.CheckpointRef}, &cp); err != nil {
		if apierrors.IsNotFound(err) {
			return "", "", "no SandboxCheckpoint " + f.Spec.CheckpointRef, nil
		}
		return "", "", "", err
	}
	if cp.Status.Phase != v1.CheckpointCompleted || !cp.Status.RemoteDurable {
		return "", "", fmt.Sprintf("checkpoint %s is not completed and in the bucket yet", cp.Name), nil
	}
	return cp.Status.ID, cp.Status.Node, "", nil
}

// makeChildren places the missing children and creates them. A child that
// exists already (made by a controller that did not live to record it) is
// left as it is: Create answers AlreadyExists.
func (r *forkPatcher) makeChildren(ctx context.Context, f *v1.SandboxFork, missing []string, holds map[string]int,
	have map[string]*v1.TurnsnapSandbox) (ctrl.Result, error) {
	all, load, err := r.placing(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	for _, k := range have { // placed, not yet running: count where they go
		if k.Status.Node == "" && k.Spec.NodeName != "" {
			load[k.Spec.NodeName]++
		}
	}
	for _, name := range missing {
		n, why := choose(all, r.opts.Now(), "", f.Spec.NodeSelector, load, r.opts.NodeCapacity, holds, "")
		if n == nil {
			f.Status.Message = why
			setCondition(&f.Status.Conditions, f.Generation, ConditionDone, metav1.ConditionFalse, "NoNode", why)
			return ctrl.Result{RequeueAfter: waitRetry}, r.status(ctx, f)
		}
		load[n.Name]++
		k := &v1.TurnsnapSandbox{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.Namespace, Labels: map[string]string{LabelFork: f.Name}},
			Spec: v1.TurnsnapSandboxSpec{FromCheckpoint: f.Status.Checkpoint, Backend: f.Spec.Backend,
				NodeName: n.Name, NodeSelector: f.Spec.NodeSelector, Restore: f.Spec.Restore},
		}
		if err := controllerutil.SetControllerReference(f, k, r.c.Scheme()); err != nil {
			return ctrl.Result{}, err
		}
		if err := r.c.Create(ctx, k); err != nil && !apierrors.IsAlreadyExists(err) {
			return ctrl.Result{}, fmt.Errorf("fork %s/%s: creating child %s: %w", f.Namespace, f.Name, name, err)
		}
		have[name] = k
	}
	return ctrl.Result{}, nil
}

// forkPatcher writes a fork's status as a merge patch from orig.
type forkPatcher struct {
	*forkReconciler
	orig *v1.SandboxFork
}

func (p *forkPatcher) status(ctx context.Context, f *v1.SandboxFork) error {
	return p.c.Status().Patch(ctx, f, crclient.MergeFrom(p.orig))
}
