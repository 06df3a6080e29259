package controller

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/turnsnap/turnsnap/internal/kubetest/kubefleet"
	v1 "github.com/turnsnap/turnsnap/kube/api/v1alpha1"
)

// TestControllerOnKubeFleet runs the controller over the kubefleet
// harness: real `turnsnap serve --kube-node` agents in network namespaces,
// registered by kube/node itself (their Leases and Secrets, TLS with the
// pinned certificate, the node agent's RBAC), one MinIO. A sandbox is
// created and checkpointed, forked 6 ways over the three nodes, and its
// node is killed: it runs elsewhere with its durable file.
func TestControllerOnKubeFleet(t *testing.T) {
	ctrl.SetLogger(Logger(testLog(t)))
	kf := kubefleet.Start(t, kubefleet.Options{})
	ctx := context.Background()
	k, err := crclient.New(kf.API.Config, crclient.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "work"}}); err != nil {
		t.Fatal(err)
	}
	stop, done := runManager(t, kf.API.Config, kubefleet.Namespace, testLog(t))
	t.Cleanup(func() { stop(); <-done })

	f := &fleet{t: t, k: k, dir: kf.Dir}
	base := makeBase(t, kf.Dir)
	node := func(name string) *kubefleet.Node {
		for _, n := range kf.Nodes {
			if n.NodeName == name {
				return n
			}
		}
		t.Fatalf("no node %s", name)
		return nil
	}
	rootOn := func(sb *v1.TurnsnapSandbox) string {
		c, err := kf.Client(ctx, node(sb.Status.Node))
		if err != nil {
			t.Fatal(err)
		}
		p, err := c.SandboxPath(ctx, sb.Status.SandboxName)
		if err != nil {
			t.Fatal(err)
		}
		return p.Root
	}
	sb := newSandbox(t, f, "agent", v1.TurnsnapSandboxSpec{Base: base})
	writeFile(t, filepath.Join(rootOn(sb), "notes.txt"), "durable\n")
	cp := checkpointOf(t, f, "agent-1", "agent")
	if !cp.Status.RemoteDurable {
		t.Fatalf("checkpoint: %+v", cp.Status)
	}

	fk := &v1.SandboxFork{ObjectMeta: metav1.ObjectMeta{Name: "six", Namespace: "work"}, Spec: v1.SandboxForkSpec{CheckpointRef: cp.Name, Count: 6}}
	if err := k.Create(ctx, fk); err != nil {
		t.Fatal(err)
	}
	fk = waitFor(t, f, &v1.SandboxFork{}, "six", wait, func(x *v1.SandboxFork) bool {
		return x.Status.Phase == v1.ForkCompleted || x.Status.Phase == v1.ForkFailed
	})
	perNode := map[string]int{}
	for _, ch := range fk.Status.Children {
		perNode[ch.Node]++
		if ch.Receipt == nil || !ch.Receipt.OK || ch.Receipt.Tree != cp.Status.Receipt.Tree {
			t.Fatalf("child %s: receipt %+v", ch.Name, ch.Receipt)
		}
	}
	if fk.Status.Phase != v1.ForkCompleted || len(perNode) != len(kf.Nodes) {
		t.Fatalf("fork: %s %s, children per node %v", fk.Status.Phase, fk.Status.Message, perNode)
	}

	dead := node(sb.Status.Node)
	killed := time.Now()
	dead.Kill()
	sb = waitFor(t, f, &v1.TurnsnapSandbox{}, "agent", wait, func(s *v1.TurnsnapSandbox) bool {
		return running(s) && s.Status.Node != dead.NodeName && s.Status.Node != ""
	})
	if got := readFile(t, filepath.Join(rootOn(sb), "notes.txt")); got != "durable\n" {
		t.Fatalf("after failover, notes.txt: %q", got)
	}
	t.Logf("fork of 6: %v; failover from %s to %s in %v", perNode, dead.NodeName, sb.Status.Node, time.Since(killed))
}

// testLog is a logger into a file of the test's (goroutines outlive t's
// own logging).
func testLog(t testing.TB) *slog.Logger {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "turnsnap-controller-"+sanitize(t.Name())+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return slog.New(slog.NewTextHandler(f, nil))
}

func sanitize(s string) string {
	out := []byte(s)
	for i, c := range out {
		if c == '/' {
			out[i] = '_'
		}
	}
	return string(out)
}
