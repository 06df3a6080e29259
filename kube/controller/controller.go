// Package controller is `turnsnap controller` (docs/KUBERNETES.md): the
// reconcilers of the turnsnap.dev/v1alpha1 resources over node agents
// (`turnsnap serve` on each node, reached with the light client over TCP).
//
//   - TurnsnapSandbox: placed on a live node (create, or branch of a
//     checkpoint), suspended (a remote-durable final checkpoint, a tag that
//     keeps it from retention, then the sandbox removed from the node) and
//     resumed anywhere (a branch of that checkpoint), and restored on
//     another node when its node's Lease expires (adopt --force: the bucket
//     fences the dead node's head writes from then on).
//   - SandboxCheckpoint: a checkpoint taken now, or one the node took,
//     recorded with its id, class, bytes and remote durability.
//   - SandboxFork: one checkpoint into N child TurnsnapSandboxes with
//     deterministic names, spread over the live nodes.
//   - agent-sandbox's Sandbox (agents.x-k8s.io), when its CRD is installed:
//     an opted-in Sandbox gets a TurnsnapSandbox it owns, suspended and
//     resumed with its operatingMode (agentsandbox.go).
//
// Every step that acts on a node is written to the object's status before
// the call (status.action, status.node), so a controller restarted between
// the two finishes it on the same node and never makes a duplicate.
package controller

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	asv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	crcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/turnsnap/turnsnap/api"
	v1 "github.com/turnsnap/turnsnap/kube/api/v1alpha1"
)

// Options configure the controller.
type Options struct {
	// Namespace holds the node agents' Leases and Secrets.
	Namespace string
	// NodeCapacity bounds the sandboxes placed on one node (0: no bound).
	NodeCapacity int
	// Workers are the reconciles that run at once per resource kind.
	Workers int
	// NodeTimeout bounds one call to a node agent.
	NodeTimeout time.Duration
	// Log receives the controller's log lines.
	Log *slog.Logger
	// Now is the clock Lease expiry is judged by (time.Now if nil).
	Now func() time.Time
}

func (o *Options) defaults() {
	if o.Workers <= 0 {
		o.Workers = 8
	}
	if o.NodeTimeout <= 0 {
		o.NodeTimeout = 5 * time.Minute
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Scheme returns a scheme with the Kubernetes types, turnsnap.dev's and
// agent-sandbox's (agents.x-k8s.io).
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1.AddToScheme(s))
	utilruntime.Must(asv1.AddToScheme(s))
	return s
}

// CacheOptions keeps the manager's cache of Secrets and Leases to the node
// agents' namespace: the controller reads no other Secret, and its RBAC
// need not let it (deploy/kubernetes/rbac.yaml).
func CacheOptions(namespace string) cache.Options {
	only := map[string]cache.Config{namespace: {}}
	return cache.Options{ByObject: map[crclient.Object]cache.ByObject{
		&corev1.Secret{}:        {Namespaces: only},
		&coordinationv1.Lease{}: {Namespaces: only},
	}}
}

// Logger is the controller-runtime logger over a slog logger.
func Logger(l *slog.Logger) logr.Logger { return logr.FromSlogHandler(l.Handler()) }

// reconciler holds what the three reconcilers share.
type reconciler struct {
	c crclient.Client
	// live reads the object a reconcile acts on from the API server, not
	// the cache: a cache that has not seen the reconciler's own last status
	// write yet would have it act again (a second suspend, a rollback to
	// prove a receipt it already has).
	live   crclient.Reader
	nodes  *nodes
	events recorder.EventRecorder
	opts   Options
}

// Setup registers the reconcilers with mgr.
func Setup(mgr ctrl.Manager, opts Options) error {
	opts.defaults()
	if opts.Namespace == "" {
		return fmt.Errorf("controller: the node agents' namespace is not set")
	}
	if err := indexFields(context.Background(), mgr); err != nil {
		return err
	}
	r := &reconciler{
		c:      mgr.GetClient(),
		live:   mgr.GetAPIReader(),
		nodes:  newNodes(mgr.GetClient(), opts.Namespace, opts.Now),
		events: mgr.GetEventRecorder("turnsnap-controller"),
		opts:   opts,
	}
	workers := crcontroller.Options{MaxConcurrentReconciles: opts.Workers}
	if err := ctrl.NewControllerManagedBy(mgr).Named("turnsnapsandbox").For(&v1.TurnsnapSandbox{}).
		WithOptions(workers).Complete(&sandboxReconciler{r}); err != nil {
		return err
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("sandboxcheckpoint").For(&v1.SandboxCheckpoint{}).
		WithOptions(workers).Complete(&checkpointReconciler{r}); err != nil {
		return err
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("sandboxfork").For(&v1.SandboxFork{}).
		Owns(&v1.TurnsnapSandbox{}).WithOptions(workers).Complete(&forkReconciler{r}); err != nil {
		return err
	}
	// agent-sandbox's Sandbox, where a platform already uses it: only when
	// its CRD is installed (a CRD installed later needs a restart).
	served, err := AgentSandboxServed(mgr.GetConfig())
	if err != nil {
		return err
	}
	if !served {
		opts.Log.Info("agent-sandbox's Sandbox is not served: its reconciler is off")
		return nil
	}
	opts.Log.Info("agent-sandbox's Sandbox is served: opted-in Sandboxes get a TurnsnapSandbox")
	return setupAgentSandbox(mgr, r, workers)
}

// Field indexes of the cache.
const (
	indexNode = "status.node" // TurnsnapSandbox by the node it is on (or placed on)
)

func indexFields(ctx context.Context, mgr ctrl.Manager) error {
	return mgr.GetFieldIndexer().IndexField(ctx, &v1.TurnsnapSandbox{}, indexNode, func(o crclient.Object) []string {
		sb := o.(*v1.TurnsnapSandbox)
		if sb.Status.Node != "" {
			return []string{sb.Status.Node}
		}
		return nil
	})
}

// nodeCtx bounds one call to a node agent.
func (r *reconciler) nodeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.opts.NodeTimeout)
}

// receiptOf is the status form of a restore's receipt.
func receiptOf(kind string, rs *api.Restore) *v1.Receipt {
	out := &v1.Receipt{Kind: kind, Checkpoint: rs.Checkpoint.String(), OK: true}
	if rc := rs.Receipt; rc != nil {
		out.OK = rc.OK
		out.Tree = rc.Files.Want.String()
		out.Want, out.Got = rc.Files.WantState.String(), rc.Files.GotState.String()
		out.Mismatch = rc.Files.Mismatch
		if rc.Processes != nil {
			out.Processes = rc.Processes.Match
		}
	}
	return out
}
