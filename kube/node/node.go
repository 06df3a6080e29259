// Package node is the node agent's side of Kubernetes: `turnsnap serve
// --kube-node NAME` registers the daemon as the turnsnap node NAME so that
// the controller (package kube/controller) can place sandboxes on it and
// notice when it dies.
//
// What a node publishes, in its namespace:
//
//   - a coordination.k8s.io/v1 Lease LeaseName(NAME) whose holderIdentity
//     is the home id of the daemon's home, renewed every leaseDuration/3
//     while the daemon serves (an update carrying the resourceVersion read
//     last, so two writers never both succeed), annotated with the API
//     endpoint. A clean shutdown releases it (holderIdentity cleared,
//     leaseDurationSeconds 1); a killed daemon stops renewing it, and once
//     renewTime is older than leaseDurationSeconds the node is dead to the
//     controller.
//   - a Secret SecretName(NAME) with the endpoint, the bearer token the
//     daemon's TCP listener demands (the per-node token), the certificate
//     to verify its TLS with, and the home id; only the controller's
//     ServiceAccount may read Secrets (deploy/kubernetes/rbac.yaml).
//
// A Lease held by another home that is still being renewed is not taken:
// the agent waits until it has seen no renewal for a whole lease duration,
// measured on its own clock from when it first saw that renewTime (as
// client-go's leader election does), so clocks that disagree cannot make
// it steal a live node's name.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
)

// The names and keys the node agent and the controller share.
const (
	// NamePrefix starts the Lease's and the Secret's names.
	NamePrefix = "turnsnap-node-"
	// LabelNode carries the node name on the Lease and the Secret, so that
	// the controller lists them with one selector.
	LabelNode = "turnsnap.dev/node"
	// LabelComponent / ComponentNodeAgent mark what the agent made.
	LabelComponent     = "app.kubernetes.io/component"
	ComponentNodeAgent = "node-agent"
	// AnnotationEndpoint on the Lease is the daemon's API URL.
	AnnotationEndpoint = "turnsnap.dev/endpoint"

	// Keys of the Secret's data.
	SecretEndpoint = "endpoint" // the daemon's API URL (https://HOST:PORT)
	SecretToken    = "token"    // the bearer token (the daemon's --token-file)
	SecretCA       = "ca.crt"   // PEM certificate(s) that verify the endpoint's TLS
	SecretHomeID   = "home-id"  // the Lease's holderIdentity

	// DefaultLeaseDuration is leaseDurationSeconds when none is given: a
	// node is dead to the controller 15 s after its last renewal.
	DefaultLeaseDuration = 15 * time.Second
)

// LeaseName is the Lease of node name.
func LeaseName(node string) string { return NamePrefix + node }

// SecretName is the Secret of node name.
func SecretName(node string) string { return NamePrefix + node }

// Config is what an Agent registers.
type Config struct {
	Client    kubernetes.Interface
	Namespace string
	Node      string // the Kubernetes node name (spec.nodeName in the DaemonSet)
	HomeID    string // the daemon's home id: the Lease's holderIdentity
	Endpoint  string // the daemon's API URL the controller calls
	Token     []byte // the bearer token the endpoint demands
	CA        []byte // PEM to verify the endpoint's TLS with (nil: plain HTTP)
	// LeaseDuration is leaseDurationSeconds (DefaultLeaseDuration if 0);
	// whole seconds, at least 3 (renewals every third of it).
	LeaseDuration time.Duration
	Log           *slog.Logger
}

// Agent keeps one node's registration.
type Agent struct {
	cfg   Config
	lease *coordv1.Lease // as last written by us (its resourceVersion)
}

// ErrLeaseLost is returned by renew when another holder took the Lease.
var ErrLeaseLost = errors.New("node lease held by another home")

// New checks cfg and returns its agent.
func New(cfg Config) (*Agent, error) {
	if cfg.Client == nil {
		return nil, errors.New("kube node: no Kubernetes client")
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.LeaseDuration < 3*time.Second || cfg.LeaseDuration%time.Second != 0 {
		return nil, fmt.Errorf("kube node: lease duration %v: whole seconds, at least 3", cfg.LeaseDuration)
	}
	for _, p := range []struct{ what, v string }{{"node name", cfg.Node}, {"namespace", cfg.Namespace}} {
		if p.v == "" {
			return nil, fmt.Errorf("kube node: no %s", p.what)
		}
	}
	if errs := validation.IsDNS1123Subdomain(LeaseName(cfg.Node)); len(errs) > 0 {
		return nil, fmt.Errorf("kube node: node name %q: %v", cfg.Node, errs)
	}
	if errs := validation.IsDNS1123Label(cfg.Namespace); len(errs) > 0 {
		return nil, fmt.Errorf("kube node: namespace %q: %v", cfg.Namespace, errs)
	}
	if cfg.HomeID == "" || cfg.Endpoint == "" || len(cfg.Token) == 0 {
		return nil, errors.New("kube node: home id, endpoint and token are required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	cfg.Log = cfg.Log.With("kube_node", cfg.Node, "namespace", cfg.Namespace)
	return &Agent{cfg: cfg}, nil
}

func (a *Agent) labels() map[string]string {
	return map[string]string{LabelNode: a.cfg.Node, LabelComponent: ComponentNodeAgent}
}

func (a *Agent) renewEvery() time.Duration { return a.cfg.LeaseDuration / 3 }

// Register writes the node's Secret and acquires its Lease, waiting while
// another home holds it live. It returns once the Lease is ours, or with
// ctx's error.
func (a *Agent) Register(ctx context.Context) error {
	if err := a.writeSecret(ctx); err != nil {
		return err
	}
	return a.acquire(ctx)
}

// Run renews the Lease every leaseDuration/3 until ctx ends. A renewal
// that fails (the API server away) is retried at the next tick; a Lease
// another home took is waited for and acquired again. Run returns nil
// when ctx ends; it does not release the Lease (Release does).
func (a *Agent) Run(ctx context.Context) error {
	t := time.NewTicker(a.renewEvery())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		err := a.renew(ctx)
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrLeaseLost):
			a.cfg.Log.Error("the node's Lease was taken by another home; waiting to acquire it again", "err", err)
			if err := a.acquire(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		default:
			a.cfg.Log.Warn("renewing the node's Lease failed; retrying", "err", err)
		}
	}
}

// Release clears the Lease's holder if it is still ours, so that the
// controller sees a node that left cleanly at once rather than after the
// lease duration. The Secret stays (the next start rewrites it).
func (a *Agent) Release(ctx context.Context) error {
	for range 5 {
		l, err := a.cfg.Client.CoordinationV1().Leases(a.cfg.Namespace).Get(ctx, LeaseName(a.cfg.Node), metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("kube node %s: releasing the Lease: %w", a.cfg.Node, err)
		}
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != a.cfg.HomeID {
			return nil // not ours any more: nothing to release
		}
		// As client-go's leader election releases: no holder, and a
		// duration of one second from now, so that a reader that looks
		// only at renewTime + leaseDurationSeconds also sees it end.
		l = l.DeepCopy()
		l.Spec.HolderIdentity = nil
		now := metav1.NowMicro()
		one := int32(1)
		l.Spec.RenewTime, l.Spec.LeaseDurationSeconds = &now, &one
		_, err = a.cfg.Client.CoordinationV1().Leases(a.cfg.Namespace).Update(ctx, l, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue // changed since the read: read it again
		}
		if err != nil {
			return fmt.Errorf("kube node %s: releasing the Lease: %w", a.cfg.Node, err)
		}
		a.lease = nil
		a.cfg.Log.Info("released the node's Lease")
		return nil
	}
	return fmt.Errorf("kube node %s: releasing the Lease: it kept changing under us", a.cfg.Node)
}

// writeSecret creates or updates the node's Secret.
func (a *Agent) writeSecret(ctx context.Context) error {
	data := map[string][]byte{
		SecretEndpoint: []byte(a.cfg.Endpoint),
		SecretToken:    a.cfg.Token,
		SecretHomeID:   []byte(a.cfg.HomeID),
	}
	if len(a.cfg.CA) > 0 {
		data[SecretCA] = a.cfg.CA
	}
	secrets := a.cfg.Client.CoreV1().Secrets(a.cfg.Namespace)
	for range 5 {
		s, err := secrets.Get(ctx, SecretName(a.cfg.Node), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			s = &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: SecretName(a.cfg.Node), Namespace: a.cfg.Namespace, Labels: a.labels()},
				Type:       corev1.SecretTypeOpaque,
				Data:       data,
			}
			_, err = secrets.Create(ctx, s, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				continue
			}
		} else if err == nil {
			s = s.DeepCopy()
			s.Labels, s.Data = mergeLabels(s.Labels, a.labels()), data
			_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
			if apierrors.IsConflict(err) {
				continue
			}
		}
		if err != nil {
			return fmt.Errorf("kube node %s: writing Secret %s/%s: %w", a.cfg.Node, a.cfg.Namespace, SecretName(a.cfg.Node), err)
		}
		return nil
	}
	return fmt.Errorf("kube node %s: writing Secret %s/%s: it kept changing under us", a.cfg.Node, a.cfg.Namespace, SecretName(a.cfg.Node))
}

func mergeLabels(have, want map[string]string) map[string]string {
	out := make(map[string]string, len(have)+len(want))
	for k, v := range have {
		out[k] = v
	}
	for k, v := range want {
		out[k] = v
	}
	return out
}
