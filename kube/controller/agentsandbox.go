package controller

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	asv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	ctrlbuilder "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	crcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	ctrl "sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/turnsnap/turnsnap/kube/api/v1alpha1"
)

// The opt-in of an agent-sandbox Sandbox (agents.x-k8s.io/v1beta1, the
// object a platform built on kubernetes-sigs/agent-sandbox already makes)
// and what it says of its TurnsnapSandbox (docs/KUBERNETES.md,
// "agent-sandbox").
const (
	// AnnotationManaged "true" opts a Sandbox in.
	AnnotationManaged = "turnsnap.dev/managed"
	// RuntimeClassTurnsnap as the pod template's runtimeClassName opts a
	// Sandbox in too.
	RuntimeClassTurnsnap = "turnsnap"
	// AnnotationBase is the TurnsnapSandbox's spec.base.
	AnnotationBase = "turnsnap.dev/base"
	// AnnotationBackend is its spec.backend (overlay when absent).
	AnnotationBackend = "turnsnap.dev/backend"
	// ConditionTurnsnap is the Sandbox's condition that reflects its
	// TurnsnapSandbox: true when that is in the operating mode asked for.
	// A type of turnsnap's own, so that agent-sandbox's controller and
	// this one never write the same condition.
	ConditionTurnsnap = "turnsnap.dev/Sandbox"
)

// AgentSandboxServed says whether the API server serves agent-sandbox's
// Sandbox (its CRD is installed): Setup registers the Sandbox reconciler
// only then, since a watch of a kind the server lacks fails the manager.
func AgentSandboxServed(cfg *rest.Config) (bool, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return false, fmt.Errorf("controller: discovery: %w", err)
	}
	rl, err := dc.ServerResourcesForGroupVersion(asv1.GroupVersion.String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("controller: discovery of %s: %w", asv1.GroupVersion, err)
	}
	for _, r := range rl.APIResources {
		if r.Name == "sandboxes" {
			return true, nil
		}
	}
	return false, nil
}

// optedIn says whether the Sandbox asks for turnsnap.
func optedIn(s *asv1.Sandbox) bool {
	if s.Annotations[AnnotationManaged] == "true" {
		return true
	}
	rc := s.Spec.PodTemplate.Spec.RuntimeClassName
	return rc != nil && *rc == RuntimeClassTurnsnap
}

// setupAgentSandbox registers the Sandbox reconciler. Sandboxes without the
// opt-in never reach it.
func setupAgentSandbox(mgr ctrlbuilder.Manager, r *reconciler, workers crcontroller.Options) error {
	opted := predicate.NewPredicateFuncs(func(o crclient.Object) bool {
		s, ok := o.(*asv1.Sandbox)
		return ok && optedIn(s)
	})
	return ctrlbuilder.NewControllerManagedBy(mgr).Named("agentsandbox").
		For(&asv1.Sandbox{}, builder.WithPredicates(opted)).
		Owns(&v1.TurnsnapSandbox{}).WithOptions(workers).Complete(&agentSandboxReconciler{r})
}

// agentSandboxReconciler keeps an opted-in Sandbox's TurnsnapSandbox (same
// name and namespace, owned by the Sandbox so that deleting the Sandbox
// deletes it) in the Sandbox's operating mode, and reflects its state in
// the Sandbox's ConditionTurnsnap. The TurnsnapSandbox reconciler does
// the work on the nodes.
type agentSandboxReconciler struct{ *reconciler }

func (r *agentSandboxReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var s asv1.Sandbox
	if err := r.live.Get(ctx, req.NamespacedName, &s); err != nil {
		return ctrl.Result{}, ignoreNotFound(err)
	}
	if !optedIn(&s) || !s.DeletionTimestamp.IsZero() {
		// Deleting: the garbage collector deletes the owned
		// TurnsnapSandbox, whose finalizer frees its node.
		return ctrl.Result{}, nil
	}
	suspend := s.Spec.OperatingMode == asv1.SandboxOperatingModeSuspended
	var tsb v1.TurnsnapSandbox
	err := r.live.Get(ctx, req.NamespacedName, &tsb)
	switch {
	case apierrors.IsNotFound(err):
		spec, why := specOf(&s)
		if why != "" {
			return ctrl.Result{}, r.reflect(ctx, &s, metav1.ConditionFalse, "InvalidOptIn", why)
		}
		tsb = v1.TurnsnapSandbox{ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace}, Spec: spec}
		if err := controllerutil.SetControllerReference(&s, &tsb, r.c.Scheme()); err != nil {
			return ctrl.Result{}, fmt.Errorf("sandbox %s/%s: %w", s.Namespace, s.Name, err)
		}
		if err := r.c.Create(ctx, &tsb); err != nil {
			if apierrors.IsInvalid(err) {
				return ctrl.Result{}, r.reflect(ctx, &s, metav1.ConditionFalse, "InvalidOptIn", err.Error())
			}
			return ctrl.Result{}, fmt.Errorf("sandbox %s/%s: creating its TurnsnapSandbox: %w", s.Namespace, s.Name, err)
		}
		r.opts.Log.Info("agent-sandbox: TurnsnapSandbox made", "sandbox", s.Namespace+"/"+s.Name, "suspend", suspend)
	case err != nil:
		return ctrl.Result{}, err
	case !metav1.IsControlledBy(&tsb, &s):
		// Never take over a TurnsnapSandbox someone else made.
		return ctrl.Result{}, r.reflect(ctx, &s, metav1.ConditionFalse, "NameTaken",
			"a TurnsnapSandbox of this name exists and is not this Sandbox's")
	case tsb.Spec.Suspend != suspend:
		patch := crclient.MergeFrom(tsb.DeepCopy())
		tsb.Spec.Suspend = suspend
		if err := r.c.Patch(ctx, &tsb, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("sandbox %s/%s: operating mode %s: %w", s.Namespace, s.Name, s.Spec.OperatingMode, err)
		}
	}
	st, reason, msg := stateOf(&tsb, suspend)
	return ctrl.Result{}, r.reflect(ctx, &s, st, reason, msg)
}

// specOf is the TurnsnapSandbox an opted-in Sandbox asks for, or why it
// asks for none.
func specOf(s *asv1.Sandbox) (v1.TurnsnapSandboxSpec, string) {
	base := s.Annotations[AnnotationBase]
	if !strings.HasPrefix(base, "/") {
		return v1.TurnsnapSandboxSpec{}, "annotation " + AnnotationBase + " must name the base directory on the nodes (an absolute path)"
	}
	spec := v1.TurnsnapSandboxSpec{
		Base:         base,
		Backend:      v1.Backend(s.Annotations[AnnotationBackend]),
		NodeSelector: s.Spec.PodTemplate.Spec.NodeSelector,
		Suspend:      s.Spec.OperatingMode == asv1.SandboxOperatingModeSuspended,
	}
	if spec.Backend == "" {
		spec.Backend = v1.BackendOverlay
	}
	return spec, ""
}

// stateOf is the Sandbox's ConditionTurnsnap for its TurnsnapSandbox.
func stateOf(tsb *v1.TurnsnapSandbox, suspend bool) (metav1.ConditionStatus, string, string) {
	st := tsb.Status
	cp := "none"
	if st.DurableCheckpoint != "" {
		cp = short(st.DurableCheckpoint)
	}
	switch {
	case st.Phase == v1.SandboxFailed:
		msg := "failed"
		if c := meta.FindStatusCondition(st.Conditions, v1.ConditionPlaced); c != nil {
			msg = c.Message
		}
		return metav1.ConditionFalse, "Failed", msg
	case suspend && st.Phase == v1.SandboxSuspended:
		return metav1.ConditionTrue, "Suspended", "suspended: checkpoint " + cp + " is in the bucket, no node holds the sandbox"
	case suspend:
		return metav1.ConditionFalse, "Suspending", "suspending from node " + st.Node
	case st.Phase == v1.SandboxRunning && st.Action == "":
		return metav1.ConditionTrue, "Running", "running on node " + st.Node + ", last durable checkpoint " + cp
	}
	if c := meta.FindStatusCondition(st.Conditions, v1.ConditionPlaced); c != nil && c.Status == metav1.ConditionFalse {
		return metav1.ConditionFalse, "Pending", c.Message
	}
	return metav1.ConditionFalse, "Pending", "being placed"
}

// reflect writes the Sandbox's ConditionTurnsnap when it changed.
func (r *agentSandboxReconciler) reflect(ctx context.Context, s *asv1.Sandbox, st metav1.ConditionStatus, reason, msg string) error {
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	if !meta.SetStatusCondition(&s.Status.Conditions, metav1.Condition{Type: ConditionTurnsnap, Status: st, Reason: reason,
		Message: msg, ObservedGeneration: s.Generation}) {
		return nil
	}
	// An update, not a patch: the conditions list is atomic in
	// agent-sandbox's CRD, and the resourceVersion keeps this write from
	// dropping a condition agent-sandbox's controller wrote meanwhile.
	if err := r.c.Status().Update(ctx, s); err != nil {
		return fmt.Errorf("sandbox %s/%s: status: %w", s.Namespace, s.Name, err)
	}
	return nil
}
