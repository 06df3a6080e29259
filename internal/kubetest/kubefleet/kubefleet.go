// Package kubefleet runs a turnsnap fleet under a real Kubernetes API
// server for tests: N hosts (network namespaces, package fleethost), each
// a real `turnsnap serve` node agent registered with the API server
// (--kube-node, package kube/node) and listening with TLS and its own
// token on its namespace's address; one MinIO bucket they share; and the
// API server (package kubetest) on the bridge's root-side address, which
// both the node agents in their namespaces and the test in the root
// namespace reach.
//
// The node agents run as the deploy/kubernetes node agent's ServiceAccount
// with the Role of deploy/kubernetes/rbac.yaml, applied for real, so the
// suite proves those permissions suffice. There is no kubelet: nothing runs
// the DaemonSet's pods; the harness starts the agents itself, as the
// kubelet would start the DaemonSet's pod on each node.
package kubefleet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/turnsnap/turnsnap/client"
	"github.com/turnsnap/turnsnap/internal/fleethost"
	"github.com/turnsnap/turnsnap/internal/kubetest"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/kube/node"
)

// Namespace is where the manifests put the node agents' Leases and Secrets.
const Namespace = node.DefaultNamespace

// NodeAgentUser is the node agents' identity: the ServiceAccount of
// deploy/kubernetes/rbac.yaml, as the API server names it.
const NodeAgentUser = "system:serviceaccount:" + Namespace + ":turnsnap-node-agent"

// apiPort is the node agents' TCP port on their namespace's address.
const apiPort = 7443

// Options configure Start.
type Options struct {
	Nodes int // default 3
	// LeaseDuration is the node agents' --kube-lease-duration (default 3 s,
	// the shortest: a killed node is dead to the controller 3 s after its
	// last renewal).
	LeaseDuration time.Duration
	// CRDDirs are installed into the API server (default: the repository's
	// deploy/kubernetes/crd when it exists).
	CRDDirs []string
	// Bucket is the shared bucket's name (default "fleet").
	Bucket string
}

// Fleet is a running fleet.
type Fleet struct {
	API    *kubetest.Env
	Net    *fleethost.Net
	MinIO  *miniotest.Server
	Bucket string
	Nodes  []*Node
	// Dir holds every host's directory; its mounts are detached at cleanup.
	Dir string
}

// Node is one host and its node agent.
type Node struct {
	*fleethost.Host
	NodeName string // the Kubernetes node name it registers as (node1 ...)
	Endpoint string // https://ADDR:7443
}

// RepoDir is the repository's root (this file's package is two below it).
func RepoDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// Start makes the fleet for t: network, MinIO, API server with the
// manifests' namespace and RBAC applied, then each node's home (pointed at
// the bucket) and its agent, waiting until every agent holds its Lease.
// Everything is stopped and removed when t ends, also when Start fails.
func Start(t testing.TB, o Options) *Fleet {
	t.Helper()
	testenv.RequireRoot(t)
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = 3 * time.Second
	}
	if o.Bucket == "" {
		o.Bucket = "fleet"
	}
	deploy := filepath.Join(RepoDir(), "deploy", "kubernetes")
	if o.CRDDirs == nil {
		if _, err := os.Stat(filepath.Join(deploy, "crd")); err == nil {
			o.CRDDirs = []string{filepath.Join(deploy, "crd")}
		}
	}
	bin := fleethost.TurnsnapBin(t)
	fn := fleethost.SetupNet(t, o.Nodes)
	f := &Fleet{Net: fn, Bucket: o.Bucket, Dir: t.TempDir()}
	t.Cleanup(func() { fleethost.UnmountUnder(t, f.Dir) }) // runs after the daemons stop
	if err := fn.RegisterDir(f.Dir); err != nil {
		t.Fatal(err)
	}
	f.MinIO = miniotest.StartAt(t, fn.Gateway())
	ctx := context.Background()
	mc, err := minio.New(f.MinIO.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(f.MinIO.AccessKey, f.MinIO.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	if err := mc.MakeBucket(ctx, o.Bucket, minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}

	f.API = kubetest.Start(t, kubetest.Options{Address: fn.Gateway(), CRDDirs: o.CRDDirs})
	if err := applyFiles(ctx, f.API, filepath.Join(deploy, "namespace.yaml"), filepath.Join(deploy, "rbac.yaml")); err != nil {
		t.Fatal(err)
	}
	agent := f.API.AddUser(t, NodeAgentUser, "system:serviceaccounts", "system:serviceaccounts:"+Namespace)

	env := []string{"AWS_ACCESS_KEY_ID=" + f.MinIO.AccessKey, "AWS_SECRET_ACCESS_KEY=" + f.MinIO.SecretKey}
	for i := 1; i <= o.Nodes; i++ {
		h := fleethost.NewHost(t, fn, i, bin, f.Dir, env)
		n := &Node{Host: h, NodeName: fmt.Sprintf("node%d", i),
			Endpoint: fmt.Sprintf("https://%s:%d", fn.HostAddr(i), apiPort)}
		d := h.Dir()
		h.ServeArgs = []string{
			"--listen", fmt.Sprintf("%s:%d", fn.HostAddr(i), apiPort),
			"--token-file", filepath.Join(d, "node", "token"),
			"--tls-cert", filepath.Join(d, "node", "tls.crt"),
			"--tls-key", filepath.Join(d, "node", "tls.key"),
			"--kube-node", n.NodeName,
			"--kubeconfig", agent.Kubeconfig,
			"--kube-namespace", Namespace,
			"--kube-lease-duration", o.LeaseDuration.String(),
		}
		if err := h.InitRemote(ctx, "s3://"+o.Bucket, f.MinIO.Endpoint); err != nil {
			t.Fatal(err)
		}
		f.Nodes = append(f.Nodes, n)
	}
	for _, n := range f.Nodes {
		if err := n.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range f.Nodes {
		if _, err := f.WaitHeld(ctx, n, time.Time{}, 60*time.Second); err != nil {
			t.Fatalf("%v\n%s", err, n.LogTail(3000))
		}
	}
	return f
}

func applyFiles(ctx context.Context, env *kubetest.Env, files ...string) error {
	for _, f := range files {
		objs, err := kubetest.ReadManifestFile(f)
		if err != nil {
			return err
		}
		if err := kubetest.Create(ctx, env.Client, objs, false); err != nil {
			return err
		}
	}
	return nil
}

// Lease is node n's Lease as the API server has it.
func (f *Fleet) Lease(ctx context.Context, n *Node) (*coordv1.Lease, error) {
	return f.API.Clientset.CoordinationV1().Leases(Namespace).Get(ctx, node.LeaseName(n.NodeName), metav1.GetOptions{})
}

// Secret is node n's Secret.
func (f *Fleet) Secret(ctx context.Context, n *Node) (*corev1.Secret, error) {
	return f.API.Clientset.CoreV1().Secrets(Namespace).Get(ctx, node.SecretName(n.NodeName), metav1.GetOptions{})
}

// WaitHeld waits until n's Lease is held by n's home with a renewTime
// after since, polling, for at most d; it returns that Lease.
func (f *Fleet) WaitHeld(ctx context.Context, n *Node, since time.Time, d time.Duration) (*coordv1.Lease, error) {
	deadline := time.Now().Add(d)
	var last string
	for {
		l, err := f.Lease(ctx, n)
		if err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == n.HomeID &&
			l.Spec.RenewTime != nil && l.Spec.RenewTime.After(since) {
			return l, nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("holder %v renewTime %v", deref(l.Spec.HolderIdentity), l.Spec.RenewTime)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s (%s): its Lease is not held by home %s within %v: %s", n.NodeName, n.Name, n.HomeID, d, last)
		}
		time.Sleep(100 * time.Millisecond) // polling the API server: the test has no watch to wait on
	}
}

// Client is the API client of node n as the controller makes it: from the
// node's Secret (endpoint, token, pinned certificate), over TCP.
func (f *Fleet) Client(ctx context.Context, n *Node) (*client.Client, error) {
	s, err := f.Secret(ctx, n)
	if err != nil {
		return nil, err
	}
	return node.Client(s)
}

func deref(p *string) string {
	if p == nil {
		return "<none>"
	}
	return *p
}
