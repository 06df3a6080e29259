package controller

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	ctrl "sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/turnsnap/turnsnap/api"
	v1 "github.com/turnsnap/turnsnap/kube/api/v1alpha1"
	kubenode "github.com/turnsnap/turnsnap/kube/node"
)

// TestReconcilersOnRealAgents drives the reconcilers by hand against
// controller-runtime's fake API client and real node agents: the
// reconcilers' decisions without kube-apiserver (TestKube runs them in a
// real manager against a real one). The test writes the node agents'
// Leases and Secrets (kube/node's part) and calls Reconcile until each
// object settles, as the manager's queue would.
// fakeAPI is n real node agents registered in a fake API client (their
// Leases held for an hour), and the reconcilers' shared part over it.
func fakeAPI(t testing.TB, n int) (*fleet, crclient.Client, *reconciler) {
	f := newAgents(t, n)
	f.ns = "turnsnap-system"
	var objs []crclient.Object
	now := metav1.NewMicroTime(time.Now())
	hour := int32(3600)
	for _, a := range f.agents {
		home := a.homeID
		objs = append(objs,
			&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: NodeObjectPrefix + a.name, Namespace: f.ns},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: &home, RenewTime: &now, LeaseDurationSeconds: &hour}},
			&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: NodeObjectPrefix + a.name, Namespace: f.ns},
				Data: map[string][]byte{kubenode.SecretEndpoint: []byte("http://" + a.addr), kubenode.SecretToken: []byte(a.token)}})
	}
	k := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(objs...).
		WithStatusSubresource(&v1.TurnsnapSandbox{}, &v1.SandboxCheckpoint{}, &v1.SandboxFork{}).Build()
	f.k = k
	opts := Options{Namespace: f.ns, Log: f.log}
	opts.defaults()
	return f, k, &reconciler{c: k, live: k, nodes: newNodes(k, f.ns, time.Now), events: events.NewFakeRecorder(100000), opts: opts}
}

func TestReconcilersOnRealAgents(t *testing.T) {
	ctx := context.Background()
	f, k, r := fakeAPI(t, 3)
	sr, cr, fr := &sandboxReconciler{r}, &checkpointReconciler{r}, &forkReconciler{r}
	settle := func(rec ctrl.Reconciler, name string) {
		t.Helper()
		for range 10 {
			res, err := rec.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "work", Name: name}})
			if err != nil {
				t.Logf("reconcile %s: %v (again)", name, err)
				continue
			}
			if res.RequeueAfter == 0 || res.RequeueAfter > waitRetry {
				return
			}
		}
	}
	get := func(name string) *v1.TurnsnapSandbox {
		t.Helper()
		var sb v1.TurnsnapSandbox
		if err := k.Get(ctx, crclient.ObjectKey{Namespace: "work", Name: name}, &sb); err != nil {
			t.Fatal(err)
		}
		return &sb
	}

	// Create and checkpoint.
	if err := k.Create(ctx, &v1.TurnsnapSandbox{ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: "work"},
		Spec: v1.TurnsnapSandboxSpec{Base: f.base, Backend: v1.BackendOverlay, NodeName: "n1"}}); err != nil {
		t.Fatal(err)
	}
	settle(sr, "agent")
	sb := get("agent")
	if !running(sb) || sb.Status.Node != "n1" {
		t.Fatalf("sandbox: %+v", sb.Status)
	}
	writeFile(t, filepath.Join(rootOf(t, f, sb), "notes.txt"), "one\n")
	if err := k.Create(ctx, &v1.SandboxCheckpoint{ObjectMeta: metav1.ObjectMeta{Name: "cp1", Namespace: "work"},
		Spec: v1.SandboxCheckpointSpec{SandboxRef: "agent"}}); err != nil {
		t.Fatal(err)
	}
	settle(cr, "cp1")
	var cp v1.SandboxCheckpoint
	if err := k.Get(ctx, crclient.ObjectKey{Namespace: "work", Name: "cp1"}, &cp); err != nil {
		t.Fatal(err)
	}
	if cp.Status.Phase != v1.CheckpointCompleted || !cp.Status.RemoteDurable || cp.Status.Class != string(api.ClassFS) {
		t.Fatalf("checkpoint: %+v", cp.Status)
	}
	// Again: the controller lost the status write; it finds its checkpoint.
	again := cp.DeepCopy()
	again.Status = v1.SandboxCheckpointStatus{}
	if err := k.Status().Update(ctx, again); err != nil {
		t.Fatal(err)
	}
	settle(cr, "cp1")
	if err := k.Get(ctx, crclient.ObjectKey{Namespace: "work", Name: "cp1"}, again); err != nil || again.Status.ID != cp.Status.ID {
		t.Fatalf("re-reconciled checkpoint: %+v %v; want the same id %s", again.Status, err, cp.Status.ID)
	}

	// Fork of 6.
	if err := k.Create(ctx, &v1.SandboxFork{ObjectMeta: metav1.ObjectMeta{Name: "fk", Namespace: "work"},
		Spec: v1.SandboxForkSpec{CheckpointRef: "cp1", Count: 6}}); err != nil {
		t.Fatal(err)
	}
	settle(fr, "fk")
	for _, name := range []string{"fk-1", "fk-2", "fk-3", "fk-4", "fk-5", "fk-6"} {
		settle(sr, name)
	}
	settle(fr, "fk")
	var fk v1.SandboxFork
	if err := k.Get(ctx, crclient.ObjectKey{Namespace: "work", Name: "fk"}, &fk); err != nil {
		t.Fatal(err)
	}
	perNode := checkFork(t, f, &fk, &cp, 6)
	t.Logf("fork of 6: %v", perNode)

	// Suspend on n1, resume on n2.
	sb = get("agent")
	sb.Spec.Suspend = true
	if err := k.Update(ctx, sb); err != nil {
		t.Fatal(err)
	}
	settle(sr, "agent")
	sb = get("agent")
	if sb.Status.Phase != v1.SandboxSuspended || sb.Status.Node != "" {
		t.Fatalf("suspended: %+v", sb.Status)
	}
	sb.Spec.Suspend, sb.Spec.NodeName = false, "n2"
	if err := k.Update(ctx, sb); err != nil {
		t.Fatal(err)
	}
	settle(sr, "agent")
	sb = get("agent")
	if !running(sb) || sb.Status.Node != "n2" || sb.Status.LastRestore == nil || !sb.Status.LastRestore.OK {
		t.Fatalf("resumed: %+v", sb.Status)
	}
	if got := readFile(t, filepath.Join(rootOf(t, f, sb), "notes.txt")); got != "one\n" {
		t.Fatalf("resumed notes.txt: %q", got)
	}

	// Failover: n2 dies.
	f.agentNamed("n2").kill()
	var l coordinationv1.Lease
	if err := k.Get(ctx, crclient.ObjectKey{Namespace: f.ns, Name: NodeObjectPrefix + "n2"}, &l); err != nil {
		t.Fatal(err)
	}
	old := metav1.NewMicroTime(time.Now().Add(-2 * time.Hour))
	l.Spec.RenewTime = &old
	if err := k.Update(ctx, &l); err != nil {
		t.Fatal(err)
	}
	settle(sr, "agent")
	sb = get("agent")
	if !running(sb) || sb.Status.Node == "n2" || sb.Status.Failovers != 1 {
		t.Fatalf("after n2 died: %+v", sb.Status)
	}
	if got := readFile(t, filepath.Join(rootOf(t, f, sb), "notes.txt")); got != "one\n" {
		t.Fatalf("failed-over notes.txt: %q", got)
	}
}
