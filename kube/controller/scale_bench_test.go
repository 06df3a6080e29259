package controller

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/benchenv"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	v1 "github.com/turnsnap/turnsnap/kube/api/v1alpha1"
)

// benchSource makes a running sandbox with a few files and a durable
// SandboxCheckpoint of it, to fork.
func benchSource(b *testing.B, f *fleet, name string) *v1.SandboxCheckpoint {
	sb := newSandbox(b, f, name, v1.TurnsnapSandboxSpec{Base: f.base, NodeName: "n1"})
	root := rootOf(b, f, sb)
	for i := range 32 {
		writeFile(b, filepath.Join(root, fmt.Sprintf("file%02d.txt", i)), strings.Repeat(fmt.Sprintf("line %d\n", i), 512))
	}
	return checkpointOf(b, f, name+"-cp", name)
}

// BenchmarkScaleKubeFork forks one checkpoint into 16 and 64 sandboxes
// (4 and 8 small) over three node agents through the CRDs and the
// controller: from the SandboxFork's creation to every child running with
// its receipt. Baseline, in the same run: the same number of branches of
// the same checkpoint made by one node agent in one request (the fan-out
// of one host, no API server, no controller, no spreading).
//
// Metrics: forkN_s, directN_s (the baseline), forkN_ratio, and load1 at
// the start and the end.
//
// Run: go test -tags turnsnaptest -run '^$' -bench ScaleKubeFork -benchtime 1x ./kube/controller/
func BenchmarkScaleKubeFork(b *testing.B) {
	sizes := []int{benchenv.Size(16, 4), benchenv.Size(64, 8)}
	f := newFleet(b, 3)
	f.startController()
	loadStart := benchenv.Load1(b)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		cp := benchSource(b, f, fmt.Sprintf("src%d", i))
		// The baseline's node learns of the checkpoint outside the timing.
		if _, err := f.agentNamed("n2").c.RebuildCatalog(context.Background(), api.RebuildRequest{}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		for _, n := range sizes {
			start := time.Now()
			rs, err := f.agentNamed("n2").c.Branch(context.Background(), cp.Status.ID, api.BranchRequest{Name: fmt.Sprintf("direct%d-%d", i, n), Count: n})
			if err != nil {
				b.Fatal(err)
			}
			direct := time.Since(start)
			if len(rs) != n {
				b.Fatalf("direct fan-out of %d made %d", n, len(rs))
			}
			res := forkAndCheck(b, f, fmt.Sprintf("bf%d-%d", i, n), cp, n, "")
			b.ReportMetric(res.took.Seconds(), fmt.Sprintf("fork%d_s", n))
			b.ReportMetric(direct.Seconds(), fmt.Sprintf("direct%d_s", n))
			b.ReportMetric(res.took.Seconds()/direct.Seconds(), fmt.Sprintf("fork%d_ratio", n))
			b.Logf("fork of %d over 3 nodes: %v %v; one node's fan-out: %v", n, res.took, res.perNode, direct)
		}
	}
	b.StopTimer()
	b.ReportMetric(loadStart, "load1_start")
	b.ReportMetric(benchenv.Load1(b), "load1_end")
}

// BenchmarkScaleKubeFailover kills a node agent (SIGKILL, its Lease no
// longer renewed) in the middle of a turn and measures the time until the
// controller has its sandbox running on another node, answering with its
// last durable checkpoint's files. Baseline, in the same run: a branch of
// the same checkpoint on another node, asked directly (the restore alone,
// without the Lease's expiry, the controller and the adoption). The
// Lease lasts 3 s here (kube/node's shortest); a real fleet's lasts 15 s
// by default, and the detection part grows with it.
//
// Metrics: failover_s, restore_direct_s, failover_ratio, lease_s, load1 at
// the start and the end.
//
// Run: go test -tags turnsnaptest -run '^$' -bench ScaleKubeFailover -benchtime 1x ./kube/controller/
func BenchmarkScaleKubeFailover(b *testing.B) {
	f := newFleet(b, 3)
	f.startController()
	loadStart := benchenv.Load1(b)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		name := fmt.Sprintf("fo%d", i)
		// Baseline: a restore of a durable checkpoint on another node.
		src := newSandbox(b, f, name+"-base", v1.TurnsnapSandboxSpec{Base: f.base, NodeName: "n1"})
		writeFile(b, filepath.Join(rootOf(b, f, src), "durable.txt"), "durable turn\n")
		cp := checkpointOf(b, f, name+"-base-cp", name+"-base")
		n2 := f.agentNamed("n2")
		if _, err := n2.c.RebuildCatalog(context.Background(), api.RebuildRequest{}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		if _, err := n2.c.Branch(context.Background(), cp.Status.ID, api.BranchRequest{Name: name + "-direct"}); err != nil {
			b.Fatal(err)
		}
		direct := time.Since(start)
		took := failover(b, f, name)
		b.ReportMetric(took.Seconds(), "failover_s")
		b.ReportMetric(direct.Seconds(), "restore_direct_s")
		b.ReportMetric(took.Seconds()/direct.Seconds(), "failover_ratio")
	}
	b.StopTimer()
	b.ReportMetric(leaseSeconds, "lease_s")
	b.ReportMetric(loadStart, "load1_start")
	b.ReportMetric(benchenv.Load1(b), "load1_end")
}

// BenchmarkScaleForkWithoutAPIServer is BenchmarkScaleKubeFork with
// controller-runtime's fake API client in place of kube-apiserver: the
// reconcilers run as a manager would run them (the fork, then its
// children, 8 at once), so the figures are the controller's and the node
// agents' share of a fork, without the API server's. Sizes 16 and 64
// (4 and 8 small) over three real node agents; baseline in the same run:
// one node agent's own fan-out of the same number in one request.
//
// Metrics: forkN_s, directN_s, forkN_ratio, load1 at the start and the end.
//
// Run: go test -tags turnsnaptest -run '^$' -bench ScaleForkWithoutAPIServer -benchtime 1x ./kube/controller/
func BenchmarkScaleForkWithoutAPIServer(b *testing.B) {
	ctx := context.Background()
	sizes := []int{benchenv.Size(16, 4), benchenv.Size(64, 8)}
	f, k, r := fakeAPI(b, 3)
	sr, cr, fr := &sandboxReconciler{r}, &checkpointReconciler{r}, &forkReconciler{r}
	loadStart := benchenv.Load1(b)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		src := fmt.Sprintf("src%d", i)
		sb := createSettled(b, ctx, k, sr, src, f.base, "n1")
		root := rootOf(b, f, sb)
		for j := range 32 {
			writeFile(b, filepath.Join(root, fmt.Sprintf("file%02d.txt", j)), strings.Repeat(fmt.Sprintf("line %d\n", j), 512))
		}
		if err := k.Create(ctx, &v1.SandboxCheckpoint{ObjectMeta: metav1.ObjectMeta{Name: src + "-cp", Namespace: "work"},
			Spec: v1.SandboxCheckpointSpec{SandboxRef: src}}); err != nil {
			b.Fatal(err)
		}
		reconcileSettled(b, ctx, cr, src+"-cp")
		var cp v1.SandboxCheckpoint
		if err := k.Get(ctx, crclient.ObjectKey{Namespace: "work", Name: src + "-cp"}, &cp); err != nil || cp.Status.Phase != v1.CheckpointCompleted {
			b.Fatalf("checkpoint: %+v %v", cp.Status, err)
		}
		if _, err := f.agentNamed("n2").c.RebuildCatalog(ctx, api.RebuildRequest{}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		for _, n := range sizes {
			start := time.Now()
			rs, err := f.agentNamed("n2").c.Branch(ctx, cp.Status.ID, api.BranchRequest{Name: fmt.Sprintf("direct%d-%d", i, n), Count: n})
			if err != nil || len(rs) != n {
				b.Fatalf("direct fan-out of %d: %d made, %v", n, len(rs), err)
			}
			direct := time.Since(start)
			name := fmt.Sprintf("bf%d-%d", i, n)
			start = time.Now()
			if err := k.Create(ctx, &v1.SandboxFork{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "work"},
				Spec: v1.SandboxForkSpec{CheckpointRef: cp.Name, Count: int32(n)}}); err != nil {
				b.Fatal(err)
			}
			reconcileSettled(b, ctx, fr, name)
			kids := make(chan string, n)
			for j := 1; j <= n; j++ {
				kids <- fmt.Sprintf("%s-%d", name, j)
			}
			close(kids)
			var wg sync.WaitGroup
			for range r.opts.Workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for kid := range kids {
						reconcileSettled(b, ctx, sr, kid)
					}
				}()
			}
			wg.Wait()
			reconcileSettled(b, ctx, fr, name)
			took := time.Since(start)
			var fk v1.SandboxFork
			if err := k.Get(ctx, crclient.ObjectKey{Namespace: "work", Name: name}, &fk); err != nil {
				b.Fatal(err)
			}
			perNode := checkFork(b, f, &fk, &cp, n)
			b.ReportMetric(took.Seconds(), fmt.Sprintf("fork%d_s", n))
			b.ReportMetric(direct.Seconds(), fmt.Sprintf("direct%d_s", n))
			b.ReportMetric(took.Seconds()/direct.Seconds(), fmt.Sprintf("fork%d_ratio", n))
			b.Logf("fork of %d over 3 nodes (no API server): %v %v; one node's fan-out: %v", n, took, perNode, direct)
		}
	}
	b.StopTimer()
	b.ReportMetric(loadStart, "load1_start")
	b.ReportMetric(benchenv.Load1(b), "load1_end")
}

// BenchmarkScaleFailoverWithoutAPIServer is the failover's share of the
// controller and the node agents, with the fake API client: a sandbox on
// n3 with a durable checkpoint; n3's agent is SIGKILLed and its Lease
// marked expired at once (so the Lease's own duration, 3 s by default in
// kubefleet and 15 s in kube/node, comes on top); measured from the kill
// until the sandbox answers on another node with the checkpoint's file.
// Baseline in the same run: a branch of the same checkpoint on another
// node, asked directly.
//
// Metrics: failover_s, restore_direct_s, failover_ratio, load1 at the
// start and the end.
//
// Run: go test -tags turnsnaptest -run '^$' -bench ScaleFailoverWithoutAPIServer -benchtime 1x ./kube/controller/
func BenchmarkScaleFailoverWithoutAPIServer(b *testing.B) {
	ctx := context.Background()
	f, k, r := fakeAPI(b, 3)
	sr, cr := &sandboxReconciler{r}, &checkpointReconciler{r}
	loadStart := benchenv.Load1(b)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		name := fmt.Sprintf("fo%d", i)
		sb := createSettled(b, ctx, k, sr, name, f.base, "n3")
		writeFile(b, filepath.Join(rootOf(b, f, sb), "durable.txt"), "durable turn\n")
		if err := k.Create(ctx, &v1.SandboxCheckpoint{ObjectMeta: metav1.ObjectMeta{Name: name + "-cp", Namespace: "work"},
			Spec: v1.SandboxCheckpointSpec{SandboxRef: name}}); err != nil {
			b.Fatal(err)
		}
		reconcileSettled(b, ctx, cr, name+"-cp")
		var cp v1.SandboxCheckpoint
		if err := k.Get(ctx, crclient.ObjectKey{Namespace: "work", Name: name + "-cp"}, &cp); err != nil || !cp.Status.RemoteDurable {
			b.Fatalf("checkpoint: %+v %v", cp.Status, err)
		}
		n1 := f.agentNamed("n1")
		if _, err := n1.c.RebuildCatalog(ctx, api.RebuildRequest{}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		if _, err := n1.c.Branch(ctx, cp.Status.ID, api.BranchRequest{Name: name + "-direct"}); err != nil {
			b.Fatal(err)
		}
		direct := time.Since(start)

		dead := f.agentNamed("n3")
		killed := time.Now()
		dead.kill()
		var l coordinationv1.Lease
		if err := k.Get(ctx, crclient.ObjectKey{Namespace: f.ns, Name: NodeObjectPrefix + "n3"}, &l); err != nil {
			b.Fatal(err)
		}
		old := metav1.NewMicroTime(time.Now().Add(-2 * time.Hour))
		l.Spec.RenewTime = &old
		if err := k.Update(ctx, &l); err != nil {
			b.Fatal(err)
		}
		reconcileSettled(b, ctx, sr, name)
		if err := k.Get(ctx, crclient.ObjectKey{Namespace: "work", Name: name}, sb); err != nil {
			b.Fatal(err)
		}
		if !running(sb) || sb.Status.Node == "n3" {
			b.Fatalf("after n3 died: %+v", sb.Status)
		}
		if got := readFile(b, filepath.Join(rootOf(b, f, sb), "durable.txt")); got != "durable turn\n" {
			b.Fatalf("restored durable.txt: %q", got)
		}
		took := time.Since(killed)
		b.StopTimer()
		b.ReportMetric(took.Seconds(), "failover_s")
		b.ReportMetric(direct.Seconds(), "restore_direct_s")
		b.ReportMetric(took.Seconds()/direct.Seconds(), "failover_ratio")
		// n3 back, its Lease renewed, for the next round.
		if err := dead.start(ctx); err != nil {
			b.Fatal(err)
		}
		if err := k.Get(ctx, crclient.ObjectKey{Namespace: f.ns, Name: NodeObjectPrefix + "n3"}, &l); err != nil {
			b.Fatal(err)
		}
		now := metav1.NewMicroTime(time.Now())
		l.Spec.RenewTime = &now
		if err := k.Update(ctx, &l); err != nil {
			b.Fatal(err)
		}
		// A change on n3's old root, so that its turn is not a skip (a
		// skip writes no head).
		if p, err := dead.c.SandboxPath(ctx, sb.Status.SandboxName); err == nil {
			writeFile(b, filepath.Join(p.Root, "late.txt"), "written by the dead node\n")
		}
		if _, err := dead.c.Checkpoint(ctx, sb.Status.SandboxName, api.CheckpointRequest{WaitRemote: true}); !errors.Is(err, errdefs.ErrPrecondition) {
			b.Fatalf("the revived n3's checkpoint of %s after the failover: %v; want fenced (precondition)", name, err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(loadStart, "load1_start")
	b.ReportMetric(benchenv.Load1(b), "load1_end")
}

// reconcileSettled calls rec for work/name, as the manager would requeue
// it, until it neither fails nor asks to look again soon (at most 20
// times: the benchmarks drive the reconcilers without a manager).
func reconcileSettled(b *testing.B, ctx context.Context, rec ctrl.Reconciler, name string) {
	for range 20 {
		res, err := rec.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "work", Name: name}})
		if err == nil && (res.RequeueAfter == 0 || res.RequeueAfter > waitRetry) {
			return
		}
		if err != nil {
			b.Logf("reconcile %s: %v (again)", name, err)
		}
	}
}

// createSettled creates the overlay sandbox work/name of base on node and
// reconciles it until it settles; it returns the sandbox as it is then.
func createSettled(b *testing.B, ctx context.Context, k crclient.Client, sr ctrl.Reconciler, name, base, node string) *v1.TurnsnapSandbox {
	if err := k.Create(ctx, &v1.TurnsnapSandbox{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "work"},
		Spec: v1.TurnsnapSandboxSpec{Base: base, Backend: v1.BackendOverlay, NodeName: node}}); err != nil {
		b.Fatal(err)
	}
	reconcileSettled(b, ctx, sr, name)
	var sb v1.TurnsnapSandbox
	if err := k.Get(ctx, crclient.ObjectKey{Namespace: "work", Name: name}, &sb); err != nil {
		b.Fatal(err)
	}
	return &sb
}
