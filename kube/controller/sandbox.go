package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/client"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	v1 "github.com/turnsnap/turnsnap/kube/api/v1alpha1"
)

// finalizer removes the sandbox from its node before the object goes.
const finalizer = "turnsnap.dev/sandbox"

// The actions recorded in status.action before the controller calls a node.
const (
	actionCreate = "create" // a new sandbox from spec.base
	actionBranch = "branch" // a new sandbox from spec.fromCheckpoint
	actionResume = "resume" // a branch of the suspended checkpoint
	actionAdopt  = "adopt"  // failover: adopt --force from a dead node
)

// Requeue bounds: a sandbox waiting for a node looks again after
// waitRetry; a running one when its node's Lease would expire unless
// renewed, but at least every maxRecheck.
const (
	waitRetry  = 2 * time.Second
	maxRecheck = time.Minute
	// fillPoll is how often a lazy restore's progress is read from its
	// node until the Filled condition is true.
	fillPoll = time.Second
)

type sandboxReconciler struct{ *reconciler }

// sandboxName is the sandbox's name on its node agent: NAMESPACE.NAME when
// that is a valid sandbox name (64 characters of A-Z a-z 0-9 . _ -), else a
// prefix of it and a hash of the whole, so that names stay unique across
// the namespaces that share the nodes and the bucket.
func sandboxName(namespace, name string) string {
	full := namespace + "." + name
	if len(full) <= 64 {
		return full
	}
	sum := sha256.Sum256([]byte(full))
	return full[:64-17] + "-" + hex.EncodeToString(sum[:8])
}

func (r *sandboxReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var sb v1.TurnsnapSandbox
	if err := r.live.Get(ctx, req.NamespacedName, &sb); err != nil {
		return ctrl.Result{}, ignoreNotFound(err)
	}
	if !sb.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.finalize(ctx, &sb)
	}
	if !hasFinalizer(&sb) {
		sb.Finalizers = append(sb.Finalizers, finalizer)
		if err := r.c.Update(ctx, &sb); err != nil {
			return ctrl.Result{}, err
		}
	}
	if sb.Status.SandboxName == "" {
		sb.Status.SandboxName = sandboxName(sb.Namespace, sb.Name)
	}
	now := r.opts.Now()
	st := &sb.Status
	if st.Node != "" {
		n, err := r.nodes.get(ctx, st.Node)
		if err != nil {
			return ctrl.Result{}, err
		}
		switch {
		case n == nil || !n.live(now):
			if st.Action != "" && st.Action != actionAdopt {
				// It never ran there (the create or branch did not
				// finish, or its answer was lost with the node): place
				// it afresh; a copy the dead node made is fenced by
				// nothing, so it is removed if the node comes back.
				return r.place(ctx, &sb, st.Action == actionResume)
			}
			return r.failover(ctx, &sb)
		case st.Action != "":
			return r.act(ctx, &sb, *n)
		case sb.Spec.Suspend:
			return r.suspend(ctx, &sb, *n)
		}
		return r.observe(ctx, &sb, *n)
	}
	if sb.Spec.Suspend {
		if st.Phase != v1.SandboxSuspended {
			st.Phase = v1.SandboxSuspended
			setCondition(&sb.Status.Conditions, sb.Generation, v1.ConditionSuspended, metav1.ConditionTrue, "Suspended", "no node holds the sandbox")
			return ctrl.Result{}, r.status(ctx, &sb)
		}
		return ctrl.Result{}, nil
	}
	return r.place(ctx, &sb, st.DurableCheckpoint != "")
}

// place chooses a live node for a sandbox that runs nowhere and records
// the choice and the action, then acts.
func (r *sandboxReconciler) place(ctx context.Context, sb *v1.TurnsnapSandbox, resume bool) (ctrl.Result, error) {
	all, load, err := r.placing(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	n, why := choose(all, r.opts.Now(), sb.Spec.NodeName, sb.Spec.NodeSelector, load, r.opts.NodeCapacity, nil, "")
	if n == nil {
		sb.Status.Phase, sb.Status.Node, sb.Status.Action = v1.SandboxPending, "", ""
		setCondition(&sb.Status.Conditions, sb.Generation, v1.ConditionPlaced, metav1.ConditionFalse, "NoNode", why)
		return ctrl.Result{RequeueAfter: waitRetry}, r.status(ctx, sb)
	}
	action := actionCreate
	switch {
	case resume:
		action = actionResume
	case sb.Spec.FromCheckpoint != "":
		action = actionBranch
	}
	sb.Status.Phase, sb.Status.Node, sb.Status.Home, sb.Status.Action = v1.SandboxPending, n.Name, n.Home, action
	if err := r.status(ctx, sb); err != nil {
		return ctrl.Result{}, err
	}
	return r.act(ctx, sb, *n)
}

// act does the recorded action on the sandbox's node. Each is idempotent:
// a sandbox the node already has is taken as made (a restarted controller
// lost the answer), an adoption the node already holds answers Already.
func (r *sandboxReconciler) act(ctx context.Context, sb *v1.TurnsnapSandbox, n node) (ctrl.Result, error) {
	c, err := r.nodes.client(n)
	if err != nil {
		return ctrl.Result{}, err
	}
	nctx, cancel := r.nodeCtx(ctx)
	defer cancel()
	st := &sb.Status
	name := st.SandboxName
	var receipt *v1.Receipt
	switch st.Action {
	case actionAdopt:
		receipt, err = r.adopt(nctx, c, n, name)
	default:
		receipt, err = r.make(nctx, c, n, sb)
	}
	if err != nil {
		err = fmt.Errorf("sandbox %s/%s: %s on node %s: %w", sb.Namespace, sb.Name, st.Action, n.Name, err)
		if errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrNotFound) {
			// The request itself is wrong (no such base or checkpoint):
			// retrying does not help.
			st.Phase = v1.SandboxFailed
			setCondition(&st.Conditions, sb.Generation, v1.ConditionPlaced, metav1.ConditionFalse, "Failed", err.Error())
			r.events.Eventf(sb, nil, corev1.EventTypeWarning, "Failed", st.Action, "%v", err)
			return ctrl.Result{}, r.status(ctx, sb)
		}
		setCondition(&st.Conditions, sb.Generation, v1.ConditionPlaced, metav1.ConditionFalse, "NodeError", err.Error())
		_ = r.status(ctx, sb)
		return ctrl.Result{}, err // retried with backoff
	}
	action := st.Action
	if action == actionResume && st.SuspendTag != "" {
		// The branch's head now keeps the checkpoint; the tag no longer
		// has to. A failure only leaves the checkpoint pinned.
		if _, err := c.DeleteTag(nctx, st.SuspendTag); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			r.opts.Log.Warn("resumed sandbox: its suspend tag stays", "sandbox", sb.Namespace+"/"+sb.Name, "tag", st.SuspendTag, "err", err)
		} else {
			st.SuspendTag = ""
		}
	}
	st.Action, st.Phase, st.Home = "", v1.SandboxRunning, n.Home
	st.LastRestore = receipt
	st.ObservedGeneration = sb.Generation
	setCondition(&st.Conditions, sb.Generation, v1.ConditionPlaced, metav1.ConditionTrue, "Running", "running on node "+n.Name)
	setCondition(&st.Conditions, sb.Generation, v1.ConditionSuspended, metav1.ConditionFalse, "Running", "running on node "+n.Name)
	next := recheck(n, r.opts.Now())
	if receipt != nil && receipt.Lazy {
		setCondition(&st.Conditions, sb.Generation, v1.ConditionFilled, metav1.ConditionFalse, "Fetching",
			"lazy restore: files arrive on first access and in the background")
		next = min(next, fillPoll)
	} else {
		setCondition(&st.Conditions, sb.Generation, v1.ConditionFilled, metav1.ConditionTrue, "Restored", "every file is on node "+n.Name)
	}
	r.events.Eventf(sb, nil, corev1.EventTypeNormal, "Running", action, "%s on node %s (checkpoint %s)", action, n.Name, short(st.Head))
	if err := r.status(ctx, sb); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: next}, nil
}

// filling says a running sandbox's lazy restore is not known to be whole.
func filling(sb *v1.TurnsnapSandbox) bool {
	return sb.Status.LastRestore != nil && sb.Status.LastRestore.Lazy &&
		!meta.IsStatusConditionTrue(sb.Status.Conditions, v1.ConditionFilled)
}

// observeFill sets the Filled condition from the node's report of the
// sandbox's lazy restore (have.Lazy) and says when to look again: every
// fillPoll while files arrive, else at the node's recheck. The progress
// is written in tenths, so a restore costs the API server about ten
// status writes, not one a second.
func (r *sandboxReconciler) observeFill(sb *v1.TurnsnapSandbox, n node, lz *api.LazyRestore) time.Duration {
	st := &sb.Status
	next := recheck(n, r.opts.Now())
	switch {
	case lz == nil:
		// The node runs no restore of it: its agent restarted, and it
		// resumes the restore when the sandbox is next used.
		setCondition(&st.Conditions, sb.Generation, v1.ConditionFilled, metav1.ConditionUnknown, "NotRunning",
			"node "+n.Name+" runs no lazy restore of the sandbox now; it resumes on the sandbox's next use")
	case lz.Whole:
		setCondition(&st.Conditions, sb.Generation, v1.ConditionFilled, metav1.ConditionTrue, "Whole",
			fmt.Sprintf("%d files (%d bytes) fetched, %d on first access", lz.Filled, lz.Bytes, lz.OnDemand))
	case lz.Error != "":
		if c := meta.FindStatusCondition(st.Conditions, v1.ConditionFilled); c == nil || c.Reason != "FetchFailed" {
			r.events.Eventf(sb, nil, corev1.EventTypeWarning, "FetchFailed", "restore", "%s", lz.Error)
		}
		setCondition(&st.Conditions, sb.Generation, v1.ConditionFilled, metav1.ConditionFalse, "FetchFailed", lz.Error)
	default:
		total := max(lz.Pending+lz.Filled, 1)
		setCondition(&st.Conditions, sb.Generation, v1.ConditionFilled, metav1.ConditionFalse, "Fetching",
			fmt.Sprintf("%d%% of %d files fetched", 10*lz.Filled/total*10, total))
		next = min(next, fillPoll)
	}
	return next
}

// make creates or branches the sandbox on its node, unless the node has
// it already: a controller stopped between the call and the status write
// lost the answer. A sandbox of the name that this action did not make
// (its origin is not the branch source) is an entry the node's catalog
// learnt from the bucket in a rebuild, while another node had it: it is
// dropped from the catalog (the bucket is left alone) and the sandbox made.
func (r *sandboxReconciler) make(ctx context.Context, c *client.Client, n node, sb *v1.TurnsnapSandbox) (*v1.Receipt, error) {
	st := &sb.Status
	name, from := st.SandboxName, branchSource(sb)
	have, err := c.GetSandbox(ctx, name)
	switch {
	case err == nil && idOf(&have.Origin) == from:
		st.Head = idOf(have.Head)
		if st.LastRestore != nil || from == "" || st.Head != from {
			return st.LastRestore, nil
		}
		// The receipt went with the answer: a rollback to the branch
		// point proves the root again (and writes nothing when it is the
		// checkpoint). Nobody was told the sandbox ran, so nobody changed
		// it since.
		rs, err := c.Rollback(ctx, name, api.RollbackRequest{Checkpoint: from})
		if err != nil {
			return nil, err
		}
		return receiptOf(st.Action, rs), nil
	case err == nil:
		r.opts.Log.Info("dropping a stale catalog entry before making the sandbox", "sandbox", sb.Namespace+"/"+sb.Name,
			"node", n.Name, "origin", have.Origin.Short(), "want", short(from))
		if _, err := c.RemoveSandbox(ctx, name, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return nil, err
		}
	case !errors.Is(err, errdefs.ErrNotFound):
		return nil, err
	}
	var receipt *v1.Receipt
	if st.Action == actionCreate {
		cr, err := c.CreateSandbox(ctx, api.CreateRequest{Name: name, Base: sb.Spec.Base, Backend: string(sb.Spec.Backend), BtrfsPool: sb.Spec.BtrfsPool})
		if err != nil {
			return nil, err
		}
		st.Head = cr.Checkpoint.String()
		receipt = &v1.Receipt{Kind: actionCreate, Checkpoint: st.Head, OK: true}
	} else {
		rs, rc, err := r.branch(ctx, c, n, from, sb.Spec.Restore, api.BranchRequest{Name: name, Backend: string(sb.Spec.Backend), BtrfsPool: sb.Spec.BtrfsPool})
		if err != nil {
			return nil, err
		}
		st.Head = rs.Checkpoint.String()
		receipt = rc
		receipt.Kind = st.Action
	}
	// In the bucket from the start (its description and head), so that a
	// failover finds it however soon its node dies.
	if _, err := c.Sync(ctx, api.SyncRequest{Sandbox: name}); err != nil {
		return nil, err
	}
	return receipt, nil
}

// branchSource is the checkpoint a branch or resume starts the sandbox
// from ("" for the other actions).
func branchSource(sb *v1.TurnsnapSandbox) string {
	switch sb.Status.Action {
	case actionBranch:
		return sb.Spec.FromCheckpoint
	case actionResume:
		return sb.Status.DurableCheckpoint
	}
	return ""
}

// branch branches a checkpoint on the node, first bringing the bucket's
// records into the node's catalog when the node does not know it, and
// returns the restore and its receipt. The restore is lazy as mode and the
// checkpoint decide (lazyFor).
func (r *sandboxReconciler) branch(ctx context.Context, c *client.Client, n node, from string, mode v1.RestoreMode,
	req api.BranchRequest) (*api.Restore, *v1.Receipt, error) {
	since := r.opts.Now()
	cp, err := c.GetCheckpoint(ctx, from)
	if errors.Is(err, errdefs.ErrNotFound) {
		if err := r.nodes.rebuild(ctx, n, since); err != nil {
			return nil, nil, err
		}
		cp, err = c.GetCheckpoint(ctx, from)
	}
	if err != nil {
		return nil, nil, err
	}
	if req.Lazy, err = lazyFor(mode, req.Backend, cp); err != nil {
		return nil, nil, err
	}
	rs, err := c.Branch(ctx, from, req)
	if err != nil {
		return nil, nil, err
	}
	if len(rs) != 1 {
		return nil, nil, fmt.Errorf("branch of %s answered %d sandboxes, want 1: %w", short(from), len(rs), errdefs.ErrUnavailable)
	}
	if rs[0].Receipt != nil && !rs[0].Receipt.OK {
		return nil, nil, fmt.Errorf("branch of %s: its receipt does not match the checkpoint (%s): %w", short(from), rs[0].Receipt.Files.Mismatch, errdefs.ErrUnavailable)
	}
	receipt := receiptOf(actionBranch, &rs[0])
	if req.Lazy {
		// No scan: the sandbox runs while its files arrive, each checked
		// against its hash as it is filled.
		receipt.Lazy, receipt.Tree = true, cp.FSTree.String()
	}
	return &rs[0], receipt, nil
}

// lazyFor says whether a restore of checkpoint cp onto a root of backend
// ("" is the checkpoint's own) is lazy under mode: Auto is lazy when it
// can be (an overlay root, no processes to bring back), Lazy must be.
func lazyFor(mode v1.RestoreMode, backend string, cp *api.LogEntry) (bool, error) {
	if backend == "" {
		backend = cp.Backend
	}
	why := ""
	switch {
	case backend != string(v1.BackendOverlay):
		why = "a lazy restore needs an overlay root, not " + backend
	case cp.Processes:
		why = "checkpoint " + cp.ID.Short() + " holds processes, which a lazy restore does not bring back"
	}
	switch mode {
	case v1.RestoreFull:
		return false, nil
	case v1.RestoreLazy:
		if why != "" {
			return false, fmt.Errorf("restore Lazy: %s: %w", why, errdefs.ErrInvalid)
		}
		return true, nil
	}
	return why == "", nil
}

// adopt takes the sandbox over on node n from the bucket (adopt --force,
// which fences the old owner), and mounts its root.
func (r *sandboxReconciler) adopt(ctx context.Context, c *client.Client, n node, name string) (*v1.Receipt, error) {
	since := r.opts.Now()
	if _, err := c.GetSandbox(ctx, name); errors.Is(err, errdefs.ErrNotFound) {
		if err := r.nodes.rebuild(ctx, n, since); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	ad, err := c.AdoptSandbox(ctx, name, api.AdoptRequest{Force: true})
	if err != nil {
		return nil, err
	}
	if _, err := c.SandboxPath(ctx, name); err != nil {
		return nil, fmt.Errorf("adopted, mounting its root: %w", err)
	}
	return &v1.Receipt{Kind: actionAdopt, Checkpoint: ad.Head, OK: true}, nil
}

// failover restores a sandbox whose node's Lease expired on another live
// node, from its last remote-durable checkpoint (the bucket's head).
func (r *sandboxReconciler) failover(ctx context.Context, sb *v1.TurnsnapSandbox) (ctrl.Result, error) {
	all, load, err := r.placing(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	dead := sb.Status.Node
	// spec.nodeName is where it starts; a failover goes anywhere else.
	n, why := choose(all, r.opts.Now(), "", sb.Spec.NodeSelector, load, r.opts.NodeCapacity, nil, dead)
	if n == nil {
		setCondition(&sb.Status.Conditions, sb.Generation, v1.ConditionPlaced, metav1.ConditionFalse, "NodeLost", fmt.Sprintf("node %s lost its lease; %s", dead, why))
		return ctrl.Result{RequeueAfter: waitRetry}, r.status(ctx, sb)
	}
	r.events.Eventf(sb, nil, corev1.EventTypeWarning, "NodeLost", actionAdopt, "node %s lost its lease; restoring on node %s", dead, n.Name)
	sb.Status.Node, sb.Status.Action, sb.Status.Phase = n.Name, actionAdopt, v1.SandboxPending
	sb.Status.Failovers++
	if err := r.status(ctx, sb); err != nil {
		return ctrl.Result{}, err
	}
	return r.act(ctx, sb, *n)
}

// suspend takes a remote-durable final checkpoint, tags it so that
// retention keeps it while no head names it, and removes the sandbox from
// its node.
func (r *sandboxReconciler) suspend(ctx context.Context, sb *v1.TurnsnapSandbox, n node) (ctrl.Result, error) {
	c, err := r.nodes.client(n)
	if err != nil {
		return ctrl.Result{}, err
	}
	nctx, cancel := r.nodeCtx(ctx)
	defer cancel()
	name := sb.Status.SandboxName
	tag := "ts-suspend-" + hashOf(string(sb.UID))
	fail := func(step string, err error) (ctrl.Result, error) {
		err = fmt.Errorf("sandbox %s/%s: suspend on node %s: %s: %w", sb.Namespace, sb.Name, n.Name, step, err)
		setCondition(&sb.Status.Conditions, sb.Generation, v1.ConditionSuspended, metav1.ConditionFalse, "SuspendFailed", err.Error())
		_ = r.status(ctx, sb)
		return ctrl.Result{}, err
	}
	if sb.Status.SuspendTag != "" {
		// A suspend that got as far as the tag before: it may have
		// removed the sandbox too.
		if _, err := c.GetSandbox(nctx, name); errors.Is(err, errdefs.ErrNotFound) {
			return r.suspended(ctx, sb, n, c, fail)
		}
	}
	cp, err := c.Checkpoint(nctx, name, api.CheckpointRequest{Message: "suspend", WaitRemote: true})
	if err != nil {
		return fail("final checkpoint", err)
	}
	if !cp.RemoteDurable {
		return fail("final checkpoint", fmt.Errorf("checkpoint %s is not in the bucket: %w", cp.ID.Short(), errdefs.ErrUnavailable))
	}
	if _, err := c.SetTag(nctx, tag, api.TagRequest{Checkpoint: cp.ID.String()}); err != nil {
		return fail("tagging "+cp.ID.Short(), err)
	}
	if _, err := c.Sync(nctx, api.SyncRequest{}); err != nil {
		return fail("pushing the tag", err)
	}
	sb.Status.DurableCheckpoint, sb.Status.Head, sb.Status.SuspendTag = cp.ID.String(), cp.ID.String(), tag
	// Recorded before the removal: a controller restarted after it resumes
	// from this checkpoint.
	if err := r.status(ctx, sb); err != nil {
		return ctrl.Result{}, err
	}
	if _, err := c.RemoveSandbox(nctx, name, false); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return fail("removing it from the node", err)
	}
	return r.suspended(ctx, sb, n, c, fail)
}

// suspended finishes a suspend once the sandbox is off its node.
func (r *sandboxReconciler) suspended(ctx context.Context, sb *v1.TurnsnapSandbox, n node, c *client.Client,
	fail func(string, error) (ctrl.Result, error)) (ctrl.Result, error) {
	// The removal reaches the bucket now, so that a node that rebuilds
	// its catalog for the resume does not learn the old sandbox again.
	nctx, cancel := r.nodeCtx(ctx)
	defer cancel()
	if _, err := c.Sync(nctx, api.SyncRequest{}); err != nil {
		return fail("pushing the removal", err)
	}
	cp := sb.Status.DurableCheckpoint
	sb.Status.Node, sb.Status.Phase, sb.Status.Action = "", v1.SandboxSuspended, ""
	sb.Status.ObservedGeneration = sb.Generation
	setCondition(&sb.Status.Conditions, sb.Generation, v1.ConditionSuspended, metav1.ConditionTrue, "Suspended", "final checkpoint "+short(cp)+" is in the bucket")
	setCondition(&sb.Status.Conditions, sb.Generation, v1.ConditionPlaced, metav1.ConditionFalse, "Suspended", "suspended")
	r.events.Eventf(sb, nil, corev1.EventTypeNormal, "Suspended", "suspend", "final checkpoint %s in the bucket; removed from node %s", short(cp), n.Name)
	return ctrl.Result{}, r.status(ctx, sb)
}

// observe refreshes a running sandbox's head after a spec change, and
// otherwise only looks again when its node's Lease would expire.
func (r *sandboxReconciler) observe(ctx context.Context, sb *v1.TurnsnapSandbox, n node) (ctrl.Result, error) {
	if sb.Status.ObservedGeneration == sb.Generation && sb.Status.Phase == v1.SandboxRunning && !filling(sb) {
		return ctrl.Result{RequeueAfter: recheck(n, r.opts.Now())}, nil
	}
	c, err := r.nodes.client(n)
	if err != nil {
		return ctrl.Result{}, err
	}
	nctx, cancel := r.nodeCtx(ctx)
	defer cancel()
	have, err := c.GetSandbox(nctx, sb.Status.SandboxName)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("sandbox %s/%s on node %s: %w", sb.Namespace, sb.Name, n.Name, err)
	}
	sb.Status.Head = idOf(have.Head)
	sb.Status.Phase = v1.SandboxRunning
	sb.Status.ObservedGeneration = sb.Generation
	next := recheck(n, r.opts.Now())
	if filling(sb) {
		next = r.observeFill(sb, n, have.Lazy)
	}
	if err := r.status(ctx, sb); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: next}, nil
}

// finalize removes the sandbox from its node (if the node lives) and lets
// the object go. Its checkpoints stay in the bucket.
func (r *sandboxReconciler) finalize(ctx context.Context, sb *v1.TurnsnapSandbox) error {
	if !hasFinalizer(sb) {
		return nil
	}
	if sb.Status.Node != "" {
		n, err := r.nodes.get(ctx, sb.Status.Node)
		if err != nil {
			return err
		}
		if n != nil && n.live(r.opts.Now()) {
			c, err := r.nodes.client(*n)
			if err != nil {
				return err
			}
			nctx, cancel := r.nodeCtx(ctx)
			defer cancel()
			if _, err := c.RemoveSandbox(nctx, sb.Status.SandboxName, false); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				return fmt.Errorf("sandbox %s/%s: removing it from node %s: %w", sb.Namespace, sb.Name, n.Name, err)
			}
		}
	}
	out := sb.Finalizers[:0]
	for _, f := range sb.Finalizers {
		if f != finalizer {
			out = append(out, f)
		}
	}
	sb.Finalizers = out
	return r.c.Update(ctx, sb)
}

// placing is what choose decides from: the nodes, and the count of
// sandboxes on (or being placed on) each.
func (r *reconciler) placing(ctx context.Context) ([]node, map[string]int, error) {
	all, err := r.nodes.list(ctx)
	if err != nil {
		return nil, nil, err
	}
	var list v1.TurnsnapSandboxList
	if err := r.c.List(ctx, &list); err != nil {
		return nil, nil, err
	}
	load := map[string]int{}
	for i := range list.Items {
		if n := list.Items[i].Status.Node; n != "" {
			load[n]++
		}
	}
	return all, load, nil
}

// status writes the object's status.
func (r *reconciler) status(ctx context.Context, o crclient.Object) error {
	return r.c.Status().Update(ctx, o)
}

func recheck(n node, now time.Time) time.Duration {
	d := n.Expires.Sub(now) + 500*time.Millisecond
	if d < waitRetry/4 {
		d = waitRetry / 4
	}
	return min(d, maxRecheck)
}

func hasFinalizer(sb *v1.TurnsnapSandbox) bool {
	for _, f := range sb.Finalizers {
		if f == finalizer {
			return true
		}
	}
	return false
}

func setCondition(conds *[]metav1.Condition, gen int64, typ string, s metav1.ConditionStatus, reason, msg string) {
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	meta.SetStatusCondition(conds, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen})
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func idOf(id *api.ID) string {
	if id == nil {
		return ""
	}
	return id.String()
}

func short(id string) string { return api.ID(id).Short() }

func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}
