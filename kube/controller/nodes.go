package controller

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/client"
	kubenode "github.com/turnsnap/turnsnap/kube/node"
)

// NodeObjectPrefix starts the names of what each node agent publishes
// (kube/node): a Lease NodeObjectPrefix+NAME whose holderIdentity is the
// agent's home id, renewed while it lives, and a Secret of the same name
// with the agent's endpoint, bearer token and certificate.
const NodeObjectPrefix = kubenode.NamePrefix

// node is one node agent as the controller sees it.
type node struct {
	Name    string
	Home    string
	Secret  *corev1.Secret    // endpoint, token, certificate
	Labels  map[string]string // the Node object's, if there is one
	Expires time.Time         // renewTime + leaseDurationSeconds
}

// live: held (a clean shutdown clears the holder) and renewed within its
// duration.
func (n node) live(now time.Time) bool { return n.Home != "" && now.Before(n.Expires) }

// nodes reads the node agents from the cache and keeps one API client per
// node (reused while its endpoint and token stay).
type nodes struct {
	c         crclient.Reader
	namespace string
	now       func() time.Time

	mu      sync.Mutex
	clients map[string]cachedClient
	// rebuilds serialises catalog rebuilds per node: a rebuild takes the
	// node's exclusive lock, and one that started after a caller saw the
	// checkpoint missing has brought it in for that caller too.
	rebuilds map[string]*nodeRebuild
}

type cachedClient struct {
	version string // the Secret's resourceVersion the client was made from
	c       *client.Client
}

type nodeRebuild struct {
	mu   sync.Mutex
	last time.Time // start of the newest rebuild that succeeded
}

func newNodes(c crclient.Reader, namespace string, now func() time.Time) *nodes {
	return &nodes{c: c, namespace: namespace, now: now, clients: map[string]cachedClient{}, rebuilds: map[string]*nodeRebuild{}}
}

// list returns every node agent with a Lease and a Secret, sorted by name.
func (ns *nodes) list(ctx context.Context) ([]node, error) {
	var leases coordinationv1.LeaseList
	if err := ns.c.List(ctx, &leases, crclient.InNamespace(ns.namespace)); err != nil {
		return nil, fmt.Errorf("listing node leases in %s: %w", ns.namespace, err)
	}
	var out []node
	for i := range leases.Items {
		l := &leases.Items[i]
		name, ok := strings.CutPrefix(l.Name, NodeObjectPrefix)
		if !ok || name == "" {
			continue
		}
		n, err := ns.fromLease(ctx, name, l)
		if err != nil {
			return nil, err
		}
		if n != nil {
			out = append(out, *n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// get returns the node NAME, or nil when it has no Lease or Secret.
func (ns *nodes) get(ctx context.Context, name string) (*node, error) {
	var l coordinationv1.Lease
	if err := ns.c.Get(ctx, crclient.ObjectKey{Namespace: ns.namespace, Name: NodeObjectPrefix + name}, &l); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("node %s: reading its lease: %w", name, err)
	}
	return ns.fromLease(ctx, name, &l)
}

func (ns *nodes) fromLease(ctx context.Context, name string, l *coordinationv1.Lease) (*node, error) {
	n := node{Name: name, Home: kubenode.Holder(l)}
	if l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil {
		n.Expires = l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
	}
	var s corev1.Secret
	if err := ns.c.Get(ctx, crclient.ObjectKey{Namespace: ns.namespace, Name: NodeObjectPrefix + name}, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil // not reachable yet: no endpoint
		}
		return nil, fmt.Errorf("node %s: reading its secret: %w", name, err)
	}
	if len(s.Data[kubenode.SecretEndpoint]) == 0 {
		return nil, nil
	}
	n.Secret = &s
	var kn corev1.Node
	if err := ns.c.Get(ctx, crclient.ObjectKey{Name: name}, &kn); err == nil {
		n.Labels = kn.Labels
	} else if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("node %s: reading its Node: %w", name, err)
	}
	return &n, nil
}

// matches says whether the node's labels satisfy a node selector.
func (n node) matches(sel map[string]string) bool {
	return len(sel) == 0 || labels.SelectorFromSet(sel).Matches(labels.Set(n.Labels))
}

// client returns the API client of the node.
func (ns *nodes) client(n node) (*client.Client, error) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if cc, ok := ns.clients[n.Name]; ok && cc.version == n.Secret.ResourceVersion {
		return cc.c, nil
	}
	c, err := kubenode.Client(n.Secret)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	ns.clients[n.Name] = cachedClient{version: n.Secret.ResourceVersion, c: c}
	return c, nil
}

// rebuild brings the bucket's sandboxes and checkpoints into the node's
// catalog, unless a rebuild that started after since already did.
func (ns *nodes) rebuild(ctx context.Context, n node, since time.Time) error {
	ns.mu.Lock()
	nr := ns.rebuilds[n.Name]
	if nr == nil {
		nr = &nodeRebuild{}
		ns.rebuilds[n.Name] = nr
	}
	ns.mu.Unlock()
	nr.mu.Lock()
	defer nr.mu.Unlock()
	if nr.last.After(since) {
		return nil
	}
	c, err := ns.client(n)
	if err != nil {
		return err
	}
	start := ns.now()
	if _, err := c.RebuildCatalog(ctx, api.RebuildRequest{}); err != nil {
		return fmt.Errorf("node %s: catalog rebuild: %w", n.Name, err)
	}
	nr.last = start
	return nil
}
