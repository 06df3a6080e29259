package kubefleet

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/turnsnap/turnsnap/internal/kubetest"
	"github.com/turnsnap/turnsnap/kube/node"
)

// Three real node agents register with the real API server (as the node
// agent's ServiceAccount, with only the manifests' Role), are reachable from
// the root namespace as the controller reaches them (endpoint, token and
// pinned certificate from their Secrets), keep their Leases renewed; a node
// agent killed with SIGKILL stops renewing (its Lease expires, still naming
// it: nothing released it), one restarted re-acquires it, one stopped cleanly
// releases it.
func TestKubeFleet(t *testing.T) {
	const lease = 3 * time.Second
	f := Start(t, Options{LeaseDuration: lease})
	ctx := context.Background()

	t.Run("registered", func(t *testing.T) {
		for _, n := range f.Nodes {
			l, err := f.Lease(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			if got := l.Annotations[node.AnnotationEndpoint]; got != n.Endpoint {
				t.Errorf("%s: endpoint annotation %q, want %q", n.NodeName, got, n.Endpoint)
			}
			if l.Spec.LeaseDurationSeconds == nil || *l.Spec.LeaseDurationSeconds != 3 {
				t.Errorf("%s: leaseDurationSeconds %v, want 3", n.NodeName, l.Spec.LeaseDurationSeconds)
			}
			s, err := f.Secret(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			tok, err := os.ReadFile(filepath.Join(n.Dir(), "node", "token"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(s.Data[node.SecretToken], bytes.TrimSpace(tok)) || len(tok) < 32 {
				t.Errorf("%s: the Secret's token is not the daemon's --token-file (%d bytes)", n.NodeName, len(tok))
			}
			if string(s.Data[node.SecretHomeID]) != n.HomeID {
				t.Errorf("%s: the Secret's home id %q, want %q", n.NodeName, s.Data[node.SecretHomeID], n.HomeID)
			}
			blk, _ := pem.Decode(s.Data[node.SecretCA])
			if blk == nil {
				t.Fatalf("%s: no certificate in the Secret", n.NodeName)
			}
			cert, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			if err := cert.VerifyHostname(f.Net.HostAddr(n.I)); err != nil {
				t.Errorf("%s: the node's certificate: %v", n.NodeName, err)
			}
		}
	})

	t.Run("reachable", func(t *testing.T) {
		for _, n := range f.Nodes {
			c, err := f.Client(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			st, err := c.Status(cctx)
			cancel()
			if err != nil {
				t.Errorf("%s: status over %s with the Secret's token: %v", n.NodeName, n.Endpoint, err)
			} else if !strings.Contains(st.Remote, f.Bucket) {
				t.Errorf("%s: status names remote %q, want the fleet's bucket %q", n.NodeName, st.Remote, f.Bucket)
			}
			// The token is what lets it in.
			s, _ := f.Secret(ctx, n)
			s.Data[node.SecretToken] = []byte("not-the-token-0123456789")
			bad, err := node.Client(s)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := bad.ListSandboxes(ctx); err == nil {
				t.Errorf("%s: a wrong token was let in", n.NodeName)
			}
		}
		// Pinned: node 1's certificate does not verify node 2.
		s1, _ := f.Secret(ctx, f.Nodes[0])
		s2, _ := f.Secret(ctx, f.Nodes[1])
		s1.Data[node.SecretEndpoint] = s2.Data[node.SecretEndpoint]
		s1.Data[node.SecretToken] = s2.Data[node.SecretToken]
		cross, err := node.Client(s1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cross.ListSandboxes(ctx); err == nil {
			t.Error("node 2 answered a client that trusts only node 1's certificate")
		}
	})

	t.Run("renewed", func(t *testing.T) {
		n := f.Nodes[0]
		l0, err := f.Lease(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WaitHeld(ctx, n, l0.Spec.RenewTime.Time, 2*lease); err != nil {
			t.Fatalf("not renewed within two lease durations: %v", err)
		}
	})

	t.Run("killed, expires, restarted", func(t *testing.T) {
		n := f.Nodes[1]
		before, err := f.Lease(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if !n.Kill() {
			t.Fatal("node 2's daemon was not running")
		}
		killed := time.Now()
		// A renewal the daemon sent just before it died may still be on
		// its way to the API server: let it land before reading the last.
		time.Sleep(time.Second)
		last, err := f.Lease(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * lease)
		after, err := f.Lease(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if !after.Spec.RenewTime.Equal(last.Spec.RenewTime) {
			t.Fatalf("renewTime moved after SIGKILL: %v -> %v", last.Spec.RenewTime, after.Spec.RenewTime)
		}
		if h := *after.Spec.HolderIdentity; h != n.HomeID {
			t.Fatalf("holder %q after SIGKILL, want the killed home %q (nothing released it)", h, n.HomeID)
		}
		if age := time.Since(after.Spec.RenewTime.Time); age <= lease {
			t.Fatalf("renewTime %v old %v after the kill: not expired", age, time.Since(killed))
		}
		restart := time.Now()
		if err := n.Start(ctx); err != nil {
			t.Fatal(err)
		}
		l, err := f.WaitHeld(ctx, n, after.Spec.RenewTime.Time, 30*time.Second)
		if err != nil {
			t.Fatalf("%v\n%s", err, n.LogTail(3000))
		}
		if *l.Spec.LeaseTransitions != *before.Spec.LeaseTransitions {
			t.Errorf("a restart of the same home counted as a transition: %d -> %d", *before.Spec.LeaseTransitions, *l.Spec.LeaseTransitions)
		}
		t.Logf("re-acquired %v after the restart began (daemon start included)", time.Since(restart).Round(time.Millisecond))
	})

	t.Run("stopped cleanly, released", func(t *testing.T) {
		n := f.Nodes[2]
		before, err := f.Lease(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Stop(); err != nil {
			t.Fatal(err)
		}
		l, err := f.Lease(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if l.Spec.HolderIdentity != nil || *l.Spec.LeaseDurationSeconds != 1 {
			t.Fatalf("after SIGTERM: holder %v, duration %d; want released", deref(l.Spec.HolderIdentity), *l.Spec.LeaseDurationSeconds)
		}
		if err := n.Start(ctx); err != nil {
			t.Fatal(err)
		}
		l, err = f.WaitHeld(ctx, n, l.Spec.RenewTime.Time, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if *l.Spec.LeaseTransitions != *before.Spec.LeaseTransitions+1 || *l.Spec.LeaseDurationSeconds != 3 {
			t.Errorf("after the restart: transitions %d (before %d), duration %d", *l.Spec.LeaseTransitions, *before.Spec.LeaseTransitions, *l.Spec.LeaseDurationSeconds)
		}
	})

	// The DaemonSet runs the node agent with flags this turnsnap has.
	t.Run("daemonset flags", func(t *testing.T) {
		objs, err := kubetest.ReadManifestFile(filepath.Join(RepoDir(), "deploy", "kubernetes", "node-agent.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		help := f.Nodes[0].Help("serve")
		var checked int
		for _, o := range objs {
			if o.GetKind() != "DaemonSet" {
				continue
			}
			var ds appsv1.DaemonSet
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ds); err != nil {
				t.Fatal(err)
			}
			for _, c := range ds.Spec.Template.Spec.Containers {
				for _, a := range c.Args {
					if strings.HasPrefix(a, "--") {
						checked++
						if !strings.Contains(help, a+" ") {
							t.Errorf("the DaemonSet passes %s, which `turnsnap serve` does not take", a)
						}
					}
				}
			}
		}
		if checked < 5 {
			t.Fatalf("checked %d flags of the DaemonSet", checked)
		}
	})
}
