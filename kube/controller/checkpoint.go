package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/client"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	v1 "github.com/turnsnap/turnsnap/kube/api/v1alpha1"
)

// ConditionDone is a SandboxCheckpoint's or SandboxFork's condition:
// finished (true), failed (false, reason Failed) or still going (false).
const ConditionDone = "Done"

// logScan bounds how many of a sandbox's newest checkpoints are searched
// for one this object already took (a restarted controller).
const logScan = 64

type checkpointReconciler struct{ *reconciler }

func (r *checkpointReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cp v1.SandboxCheckpoint
	if err := r.live.Get(ctx, req.NamespacedName, &cp); err != nil {
		return ctrl.Result{}, ignoreNotFound(err)
	}
	if cp.Status.Phase == v1.CheckpointCompleted || cp.Status.Phase == v1.CheckpointFailed {
		return ctrl.Result{}, nil
	}
	wait := func(why string) (ctrl.Result, error) {
		cp.Status.Phase = v1.CheckpointPending
		setCondition(&cp.Status.Conditions, cp.Generation, ConditionDone, metav1.ConditionFalse, "Waiting", why)
		return ctrl.Result{RequeueAfter: waitRetry}, r.status(ctx, &cp)
	}
	var sb v1.TurnsnapSandbox
	if err := r.c.Get(ctx, crclient.ObjectKey{Namespace: cp.Namespace, Name: cp.Spec.SandboxRef}, &sb); err != nil {
		if ignoreNotFound(err) == nil {
			return wait("no TurnsnapSandbox " + cp.Spec.SandboxRef)
		}
		return ctrl.Result{}, err
	}
	if sb.Status.Phase != v1.SandboxRunning || sb.Status.Node == "" {
		return wait(fmt.Sprintf("sandbox %s is %s, not running", sb.Name, phaseOr(sb.Status.Phase)))
	}
	n, err := r.nodes.get(ctx, sb.Status.Node)
	if err != nil {
		return ctrl.Result{}, err
	}
	if n == nil || !n.live(r.opts.Now()) {
		return wait("node " + sb.Status.Node + " is not live")
	}
	c, err := r.nodes.client(*n)
	if err != nil {
		return ctrl.Result{}, err
	}
	nctx, cancel := r.nodeCtx(ctx)
	defer cancel()
	got, durable, err := r.take(nctx, c, &cp, sb.Status.SandboxName)
	if err != nil {
		err = fmt.Errorf("checkpoint %s/%s of sandbox %s on node %s: %w", cp.Namespace, cp.Name, sb.Name, n.Name, err)
		if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrPrecondition) {
			cp.Status.Phase, cp.Status.Message = v1.CheckpointFailed, err.Error()
			setCondition(&cp.Status.Conditions, cp.Generation, ConditionDone, metav1.ConditionFalse, "Failed", err.Error())
			r.events.Eventf(&cp, nil, corev1.EventTypeWarning, "Failed", "checkpoint", "%v", err)
			return ctrl.Result{}, r.status(ctx, &cp)
		}
		return ctrl.Result{}, err
	}
	cp.Status = v1.SandboxCheckpointStatus{
		Phase: v1.CheckpointCompleted, ID: got.ID.String(), Class: string(got.Class), Turn: int64(got.Turn),
		Bytes: got.BytesNew, RemoteDurable: durable, Node: n.Name,
		Receipt:    &v1.Receipt{Kind: "checkpoint", Checkpoint: got.ID.String(), OK: true, Tree: got.FSTree.String()},
		Conditions: cp.Status.Conditions,
	}
	setCondition(&cp.Status.Conditions, cp.Generation, ConditionDone, metav1.ConditionTrue, "Completed", "checkpoint "+got.ID.Short())
	r.events.Eventf(&cp, nil, corev1.EventTypeNormal, "Completed", "checkpoint", "checkpoint %s (%s, %d bytes new) on node %s", got.ID.Short(), got.Class, got.BytesNew, n.Name)
	if err := r.status(ctx, &cp); err != nil {
		return ctrl.Result{}, err
	}
	if durable {
		// The sandbox's failover and resume restore from here on.
		patch := crclient.MergeFrom(sb.DeepCopy())
		sb.Status.DurableCheckpoint, sb.Status.Head = got.ID.String(), got.ID.String()
		if err := r.c.Status().Patch(ctx, &sb, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("checkpoint %s/%s: noting it on sandbox %s: %w", cp.Namespace, cp.Name, sb.Name, err)
		}
	}
	return ctrl.Result{}, nil
}

// take takes the checkpoint (or finds the one named), and says whether it
// is in the bucket. The checkpoint's message carries the object's UID, so
// that a restarted controller finds the checkpoint it took instead of
// taking a second.
func (r *checkpointReconciler) take(ctx context.Context, c *client.Client, cp *v1.SandboxCheckpoint, name string) (*api.LogEntry, bool, error) {
	if id := cp.Spec.CheckpointID; id != "" {
		e, err := c.GetCheckpoint(ctx, id)
		if err != nil {
			return nil, false, err
		}
		if string(e.Sandbox) != name {
			return nil, false, fmt.Errorf("checkpoint %s is of sandbox %s, not %s: %w", short(id), e.Sandbox, name, errdefs.ErrInvalid)
		}
		return e, r.push(ctx, c, cp, name) == nil, nil
	}
	mark := "k8s:" + string(cp.UID)
	log, err := c.Log(ctx, name)
	if err != nil {
		return nil, false, err
	}
	for i, e := range log {
		if i == logScan {
			break
		}
		if strings.HasPrefix(e.Message, mark) {
			return &e, r.push(ctx, c, cp, name) == nil, nil
		}
	}
	msg := mark
	if cp.Spec.Message != "" {
		msg += " " + cp.Spec.Message
	}
	got, err := c.Checkpoint(ctx, name, api.CheckpointRequest{Message: msg, WaitRemote: !cp.Spec.Local, RecordSkips: true})
	if err != nil {
		return nil, false, err
	}
	e, err := c.GetCheckpoint(ctx, got.ID.String())
	if err != nil {
		return nil, false, err
	}
	e.BytesNew = got.BytesNew
	return e, got.RemoteDurable, nil
}

// push waits until the sandbox's queue is in the bucket (Local: not at all).
func (r *checkpointReconciler) push(ctx context.Context, c *client.Client, cp *v1.SandboxCheckpoint, name string) error {
	if cp.Spec.Local {
		return errors.New("local")
	}
	_, err := c.Sync(ctx, api.SyncRequest{Sandbox: name})
	return err
}

func phaseOr(p v1.SandboxPhase) string {
	if p == "" {
		return "new"
	}
	return string(p)
}
