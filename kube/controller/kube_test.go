package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	v1 "github.com/turnsnap/turnsnap/kube/api/v1alpha1"
)

// wait bounds each step's wait; the machine is shared and slow at times.
const wait = 3 * time.Minute

func running(sb *v1.TurnsnapSandbox) bool {
	return sb.Status.Phase == v1.SandboxRunning && sb.Status.Action == ""
}

// newSandbox creates a TurnsnapSandbox in namespace work and waits until
// it runs.
func newSandbox(t testing.TB, f *fleet, name string, spec v1.TurnsnapSandboxSpec) *v1.TurnsnapSandbox {
	t.Helper()
	sb := &v1.TurnsnapSandbox{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "work"}, Spec: spec}
	if err := f.k.Create(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	return waitFor(t, f, &v1.TurnsnapSandbox{}, name, wait, running)
}

// checkpointOf takes a SandboxCheckpoint through the API and waits for it.
func checkpointOf(t testing.TB, f *fleet, name, sandbox string) *v1.SandboxCheckpoint {
	t.Helper()
	cp := &v1.SandboxCheckpoint{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "work"}, Spec: v1.SandboxCheckpointSpec{SandboxRef: sandbox}}
	if err := f.k.Create(context.Background(), cp); err != nil {
		t.Fatal(err)
	}
	cp = waitFor(t, f, &v1.SandboxCheckpoint{}, name, wait, func(c *v1.SandboxCheckpoint) bool {
		return c.Status.Phase == v1.CheckpointCompleted || c.Status.Phase == v1.CheckpointFailed
	})
	if cp.Status.Phase != v1.CheckpointCompleted {
		t.Fatalf("checkpoint %s: %s: %s", name, cp.Status.Phase, cp.Status.Message)
	}
	return cp
}

// rootOf is the sandbox's root on its node (the node agents share this
// machine's filesystem).
func rootOf(t testing.TB, f *fleet, sb *v1.TurnsnapSandbox) string {
	t.Helper()
	a := f.agentNamed(sb.Status.Node)
	p, err := a.c.SandboxPath(context.Background(), sb.Status.SandboxName)
	if err != nil {
		t.Fatalf("sandbox %s on %s: %v", sb.Name, a.name, err)
	}
	return p.Root
}

func writeFile(t testing.TB, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestKube runs the scenarios of issue 28 against one API server, one
// bucket and three node agents, in order: each leaves the fleet as the
// next expects it.
func TestKube(t *testing.T) {
	f := newFleet(t, 3)
	f.startController()

	t.Run("ValidationRejectsBadSpecs", func(t *testing.T) {
		ctx := context.Background()
		bad := []*v1.TurnsnapSandbox{
			{ObjectMeta: metav1.ObjectMeta{Name: "both", Namespace: "work"}, Spec: v1.TurnsnapSandboxSpec{Base: f.base, FromCheckpoint: "0123456789abcdef"}},
			{ObjectMeta: metav1.ObjectMeta{Name: "neither", Namespace: "work"}},
			{ObjectMeta: metav1.ObjectMeta{Name: "relative", Namespace: "work"}, Spec: v1.TurnsnapSandboxSpec{Base: "rel/dir"}},
			{ObjectMeta: metav1.ObjectMeta{Name: "backend", Namespace: "work"}, Spec: v1.TurnsnapSandboxSpec{Base: f.base, Backend: "zfs"}},
		}
		for _, sb := range bad {
			if err := f.k.Create(ctx, sb); !apierrors.IsInvalid(err) {
				t.Errorf("creating %s: %v; want the API server's validation error", sb.Name, err)
			}
		}
		fk := &v1.SandboxFork{ObjectMeta: metav1.ObjectMeta{Name: "toomany", Namespace: "work"}, Spec: v1.SandboxForkSpec{Checkpoint: "0123456789abcdef", Count: 257}}
		if err := f.k.Create(ctx, fk); !apierrors.IsInvalid(err) {
			t.Errorf("fork of 257: %v; want the API server's validation error", err)
		}
		fk = &v1.SandboxFork{ObjectMeta: metav1.ObjectMeta{Name: "sometimes", Namespace: "work"}, Spec: v1.SandboxForkSpec{Checkpoint: "0123456789abcdef", Count: 2, Restore: "Sometimes"}}
		if err := f.k.Create(ctx, fk); !apierrors.IsInvalid(err) {
			t.Errorf("fork with restore Sometimes: %v; want the API server's validation error", err)
		}
	})

	var cp *v1.SandboxCheckpoint
	t.Run("CreateAndCheckpoint", func(t *testing.T) {
		sb := newSandbox(t, f, "agent", v1.TurnsnapSandboxSpec{Base: f.base})
		if sb.Status.Node == "" || sb.Status.Head == "" || sb.Status.SandboxName != "work.agent" {
			t.Fatalf("running sandbox status: %+v", sb.Status)
		}
		root := rootOf(t, f, sb)
		writeFile(t, filepath.Join(root, "notes.txt"), "turn one\n")
		cp = checkpointOf(t, f, "agent-1", "agent")
		if cp.Status.Class != string(api.ClassFS) || !cp.Status.RemoteDurable || cp.Status.Bytes == 0 || cp.Status.Node != sb.Status.Node {
			t.Fatalf("checkpoint status: %+v; want class fs, remote-durable, bytes, on %s", cp.Status, sb.Status.Node)
		}
		// The node agent has it as the sandbox's head.
		a := f.agentNamed(sb.Status.Node)
		got, err := a.c.GetSandbox(context.Background(), "work.agent")
		if err != nil || got.Head == nil || got.Head.String() != cp.Status.ID {
			t.Fatalf("node %s: sandbox head %v, %v; want %s", a.name, got, err, cp.Status.ID)
		}
		// The sandbox notes it as what a failover or resume restores.
		waitFor(t, f, &v1.TurnsnapSandbox{}, "agent", wait, func(s *v1.TurnsnapSandbox) bool { return s.Status.DurableCheckpoint == cp.Status.ID })
		// A checkpoint the node took itself, recorded.
		writeFile(t, filepath.Join(root, "notes.txt"), "turn two\n")
		own, err := a.c.Checkpoint(context.Background(), "work.agent", api.CheckpointRequest{})
		if err != nil {
			t.Fatal(err)
		}
		rec := &v1.SandboxCheckpoint{ObjectMeta: metav1.ObjectMeta{Name: "agent-2", Namespace: "work"},
			Spec: v1.SandboxCheckpointSpec{SandboxRef: "agent", CheckpointID: own.ID.String()}}
		if err := f.k.Create(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
		rec = waitFor(t, f, &v1.SandboxCheckpoint{}, "agent-2", wait, func(c *v1.SandboxCheckpoint) bool {
			return c.Status.Phase != "" && c.Status.Phase != v1.CheckpointPending
		})
		if rec.Status.ID != own.ID.String() || rec.Status.Class != string(own.Class) || !rec.Status.RemoteDurable {
			t.Fatalf("recorded checkpoint: %+v; want %s %s, remote-durable", rec.Status, own.ID.Short(), own.Class)
		}
	})
	if cp == nil {
		t.FailNow()
	}

	t.Run("Fork16", func(t *testing.T) {
		// restore Auto: every child lazy (an overlay checkpoint without
		// processes), its files fetched as they are read.
		res := forkAndCheck(t, f, "f16", cp, 16, "")
		t.Logf("fork of 16 over %d nodes: %v (%v)", len(res.perNode), res.took, res.perNode)
		for i := 1; i <= 16; i++ {
			k := filled(t, f, fmt.Sprintf("f16-%d", i))
			if got := readFile(t, filepath.Join(rootOf(t, f, k), "notes.txt")); got != "turn one\n" {
				t.Fatalf("child %s's notes.txt: %q", k.Name, got)
			}
		}
	})

	t.Run("ControllerRestartMidFork", func(t *testing.T) {
		ctx := context.Background()
		// restore Full: each child's root is written whole and scanned
		// (its receipt names the state found) before it runs.
		fk := &v1.SandboxFork{ObjectMeta: metav1.ObjectMeta{Name: "fr", Namespace: "work"}, Spec: v1.SandboxForkSpec{CheckpointRef: cp.Name, Count: 12, Restore: v1.RestoreFull}}
		if err := f.k.Create(ctx, fk); err != nil {
			t.Fatal(err)
		}
		// Stop the controller as soon as the fork has made children.
		deadline := time.Now().Add(wait)
		for {
			var kids v1.TurnsnapSandboxList
			if err := f.k.List(ctx, &kids, crclient.InNamespace("work"), crclient.MatchingLabels{LabelFork: "fr"}); err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, k := range kids.Items {
				if k.Status.Phase == v1.SandboxRunning {
					n++
				}
			}
			if len(kids.Items) >= 1 {
				t.Logf("stopping the controller with %d of 12 children made, %d running", len(kids.Items), n)
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no child of fork fr ran")
			}
			time.Sleep(20 * time.Millisecond)
		}
		f.stopController()
		f.startController()
		fk = waitFor(t, f, &v1.SandboxFork{}, "fr", wait, func(x *v1.SandboxFork) bool {
			return x.Status.Phase == v1.ForkCompleted || x.Status.Phase == v1.ForkFailed
		})
		checkFork(t, f, fk, cp, 12)
		if r := fk.Status.Children[0].Receipt; r.Lazy {
			t.Fatalf("fork fr (restore Full): child receipt %+v is lazy", r)
		}
	})

	t.Run("SuspendResumeOnAnotherNode", func(t *testing.T) {
		ctx := context.Background()
		sb := newSandbox(t, f, "sleeper", v1.TurnsnapSandboxSpec{Base: f.base, NodeName: "n1"})
		if sb.Status.Node != "n1" {
			t.Fatalf("placed on %s, want n1 (spec.nodeName)", sb.Status.Node)
		}
		writeFile(t, filepath.Join(rootOf(t, f, sb), "state.txt"), "before suspend\n")
		patch := crclient.MergeFrom(sb.DeepCopy())
		sb.Spec.Suspend = true
		if err := f.k.Patch(ctx, sb, patch); err != nil {
			t.Fatal(err)
		}
		sb = waitFor(t, f, &v1.TurnsnapSandbox{}, "sleeper", wait, func(s *v1.TurnsnapSandbox) bool { return s.Status.Phase == v1.SandboxSuspended })
		if sb.Status.Node != "" || sb.Status.DurableCheckpoint == "" || sb.Status.SuspendTag == "" {
			t.Fatalf("suspended status: %+v", sb.Status)
		}
		if _, err := f.agentNamed("n1").c.GetSandbox(ctx, "work.sleeper"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("n1 still has the suspended sandbox: %v", err)
		}
		patch = crclient.MergeFrom(sb.DeepCopy())
		sb.Spec.Suspend, sb.Spec.NodeName = false, "n2"
		if err := f.k.Patch(ctx, sb, patch); err != nil {
			t.Fatal(err)
		}
		sb = waitFor(t, f, &v1.TurnsnapSandbox{}, "sleeper", wait, running)
		if r := sb.Status.LastRestore; sb.Status.Node != "n2" || r == nil || !r.OK || r.Kind != actionResume || !r.Lazy || r.Checkpoint != sb.Status.DurableCheckpoint {
			t.Fatalf("resumed status: %+v, restore %+v; want running on n2 with an OK lazy resume receipt", sb.Status, sb.Status.LastRestore)
		}
		// Read before the fetch-ahead is known to be done: the file is
		// filled on this first open if it was not yet.
		if got := readFile(t, filepath.Join(rootOf(t, f, sb), "state.txt")); got != "before suspend\n" {
			t.Fatalf("resumed sandbox's state.txt: %q", got)
		}
		sb = filled(t, f, "sleeper")
		// A turn after the resume records what the agent changed, not
		// the restore: nothing.
		c, err := f.agentNamed("n2").c.Checkpoint(ctx, sb.Status.SandboxName, api.CheckpointRequest{})
		if err != nil || c.Class != api.ClassSkip {
			t.Fatalf("first checkpoint after a lazy resume: %+v %v; want skip", c, err)
		}
	})

	t.Run("FailoverFencesTheDeadNode", func(t *testing.T) {
		res := failover(t, f, "victim")
		t.Logf("failover: node death to restored sandbox answering: %v", res)
	})
}

type forkResult struct {
	took    time.Duration
	perNode map[string]int
}

// filled waits until sandbox name's Filled condition is true (every file
// of its restore on its node) and returns it.
func filled(t testing.TB, f *fleet, name string) *v1.TurnsnapSandbox {
	t.Helper()
	sb := waitFor(t, f, &v1.TurnsnapSandbox{}, name, wait, func(s *v1.TurnsnapSandbox) bool {
		c := meta.FindStatusCondition(s.Status.Conditions, v1.ConditionFilled)
		return c != nil && (c.Status == metav1.ConditionTrue || c.Reason == "FetchFailed")
	})
	if c := meta.FindStatusCondition(sb.Status.Conditions, v1.ConditionFilled); c.Status != metav1.ConditionTrue {
		t.Fatalf("sandbox %s: %s: %s", name, c.Reason, c.Message)
	}
	return sb
}

// forkAndCheck forks cp into n children (mode: spec.restore, "" the
// default) and checks them.
func forkAndCheck(t testing.TB, f *fleet, name string, cp *v1.SandboxCheckpoint, n int, mode v1.RestoreMode) forkResult {
	fk := &v1.SandboxFork{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "work"}, Spec: v1.SandboxForkSpec{CheckpointRef: cp.Name, Count: int32(n), Restore: mode}}
	start := time.Now()
	if err := f.k.Create(context.Background(), fk); err != nil {
		t.Fatal(err)
	}
	fk = waitFor(t, f, &v1.SandboxFork{}, name, 2*wait, func(x *v1.SandboxFork) bool {
		return x.Status.Phase == v1.ForkCompleted || x.Status.Phase == v1.ForkFailed
	})
	took := time.Since(start)
	return forkResult{took: took, perNode: checkFork(t, f, fk, cp, n)}
}

// checkFork checks a finished fork: completed; n children, each once,
// spread over every node; every receipt OK, of the checkpoint's tree, and
// equal (a full restore's names the state its scan found, the
// checkpoint's; a lazy one made no scan); no node agent holds a child
// twice or a child another node holds.
func checkFork(t testing.TB, f *fleet, fk *v1.SandboxFork, cp *v1.SandboxCheckpoint, n int) map[string]int {
	t.Helper()
	if fk.Status.Phase != v1.ForkCompleted || int(fk.Status.Ready) != n || len(fk.Status.Children) != n || fk.Status.Checkpoint != cp.Status.ID {
		t.Fatalf("fork %s: phase %s ready %d children %d checkpoint %s: %s", fk.Name, fk.Status.Phase, fk.Status.Ready, len(fk.Status.Children), fk.Status.Checkpoint, fk.Status.Message)
	}
	perNode := map[string]int{}
	var want *v1.Receipt
	for _, ch := range fk.Status.Children {
		perNode[ch.Node]++
		r := ch.Receipt
		if r == nil || !r.OK || r.Checkpoint != cp.Status.ID || r.Tree != cp.Status.Receipt.Tree || (!r.Lazy && (r.Got == "" || r.Got != r.Want)) {
			t.Fatalf("fork %s child %s on %s: receipt %+v; want OK for %s", fk.Name, ch.Name, ch.Node, r, cp.Status.ID)
		}
		if want == nil {
			want = r
		} else if *r != *want {
			t.Fatalf("fork %s: child %s's receipt %+v differs from %+v", fk.Name, ch.Name, r, want)
		}
	}
	if len(perNode) != len(f.agents) {
		t.Fatalf("fork %s: children on %d nodes (%v), want all %d", fk.Name, len(perNode), perNode, len(f.agents))
	}
	// No duplicates on the nodes themselves.
	where := map[string][]string{}
	for _, a := range f.agents {
		if !a.alive() {
			continue
		}
		list, err := a.c.ListSandboxes(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list {
			// A node's catalog also lists the sandboxes it learnt from
			// the bucket in a rebuild; only those it made have a root.
			if _, err := os.Stat(s.Root); err == nil && strings.HasPrefix(s.Name, "work."+fk.Name+"-") {
				where[s.Name] = append(where[s.Name], a.name)
			}
		}
	}
	if len(where) != n {
		t.Fatalf("fork %s: the nodes hold %d children, want %d: %v", fk.Name, len(where), n, where)
	}
	for name, nodes := range where {
		if len(nodes) != 1 {
			t.Fatalf("fork %s: child %s is on %v", fk.Name, name, nodes)
		}
	}
	var kids v1.TurnsnapSandboxList
	if err := f.k.List(context.Background(), &kids, crclient.InNamespace("work"), crclient.MatchingLabels{LabelFork: fk.Name}); err != nil {
		t.Fatal(err)
	}
	if len(kids.Items) != n {
		t.Fatalf("fork %s: %d TurnsnapSandboxes, want %d", fk.Name, len(kids.Items), n)
	}
	return perNode
}

func (a *agent) alive() bool { return a.h.Running() }

// failover runs a sandbox on a node, makes a durable checkpoint, kills the
// node's agent with SIGKILL in the middle of its next turn and stops its
// Lease; the controller must restore the sandbox on another node at the
// durable checkpoint. Then the dead node comes back and must not be able
// to write the sandbox's head. It returns the time from the kill to the
// restored sandbox answering with the checkpoint's file.
func failover(t testing.TB, f *fleet, name string) time.Duration {
	ctx := context.Background()
	sb := &v1.TurnsnapSandbox{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "work"}, Spec: v1.TurnsnapSandboxSpec{Base: f.base, NodeName: "n3"}}
	if err := f.k.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	sb = waitFor(t, f, &v1.TurnsnapSandbox{}, name, wait, running)
	dead := f.agentNamed(sb.Status.Node)
	root := rootOf(t, f, sb)
	writeFile(t, filepath.Join(root, "durable.txt"), "durable turn\n")
	cp := checkpointOf(t, f, name+"-1", name)
	// A turn in flight when the node dies: 8 MiB being checkpointed.
	big := make([]byte, 8<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	if err := os.WriteFile(filepath.Join(root, "inflight.bin"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := dead.c.Checkpoint(ctx, sb.Status.SandboxName, api.CheckpointRequest{WaitRemote: true})
		t.Logf("the checkpoint in flight on %s: %v", dead.name, err)
	}()
	time.Sleep(30 * time.Millisecond) // into the turn
	killed := time.Now()
	dead.kill()
	wg.Wait()
	var took time.Duration
	deadline := time.Now().Add(wait)
	for {
		var cur v1.TurnsnapSandbox
		if err := f.k.Get(ctx, crclient.ObjectKey{Namespace: "work", Name: name}, &cur); err != nil {
			t.Fatal(err)
		}
		if running(&cur) && cur.Status.Node != dead.name && cur.Status.Node != "" {
			a := f.agentNamed(cur.Status.Node)
			if p, err := a.c.SandboxPath(ctx, cur.Status.SandboxName); err == nil {
				if b, err := os.ReadFile(filepath.Join(p.Root, "durable.txt")); err == nil && string(b) == "durable turn\n" {
					took = time.Since(killed)
					sb = &cur
					break
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s not restored off %s within %v: %+v", name, dead.name, wait, cur.Status)
		}
		time.Sleep(20 * time.Millisecond) // polling the API server and the node
	}
	if sb.Status.Failovers < 1 || sb.Status.LastRestore == nil || sb.Status.LastRestore.Kind != actionAdopt {
		t.Fatalf("restored sandbox status: %+v", sb.Status)
	}
	// Every sandbox the dead node had runs elsewhere now.
	deadline = time.Now().Add(wait)
	for {
		var all v1.TurnsnapSandboxList
		if err := f.k.List(ctx, &all, crclient.InNamespace("work")); err != nil {
			t.Fatal(err)
		}
		left := []string{}
		for _, x := range all.Items {
			if x.Status.Node == dead.name || (x.Status.Phase != v1.SandboxRunning && x.Status.Phase != v1.SandboxSuspended) {
				left = append(left, x.Name+"@"+x.Status.Node+":"+string(x.Status.Phase))
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandboxes not restored off %s: %v", dead.name, left)
		}
		time.Sleep(100 * time.Millisecond) // polling the API server
	}
	if sb.Status.LastRestore.Checkpoint != cp.Status.ID {
		// The turn in flight may have reached the bucket before the kill:
		// then it is the head, and it is durable too.
		t.Logf("restored at %s, the durable checkpoint was %s (the turn in flight reached the bucket)", short(sb.Status.LastRestore.Checkpoint), short(cp.Status.ID))
	}
	// The dead node comes back: its head writes for the sandbox are fenced.
	if err := dead.start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "durable.txt")); err == nil {
		writeFile(t, filepath.Join(root, "late.txt"), "written by the dead node\n")
	}
	_, err := dead.c.Checkpoint(ctx, sb.Status.SandboxName, api.CheckpointRequest{WaitRemote: true})
	if !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("the revived node %s checkpointed %s to the bucket: %v; want it fenced (precondition)", dead.name, name, err)
	}
	// The new owner still writes.
	now := f.agentNamed(sb.Status.Node)
	writeFile(t, filepath.Join(rootOf(t, f, sb), "after.txt"), "after failover\n")
	if c, err := now.c.Checkpoint(ctx, sb.Status.SandboxName, api.CheckpointRequest{WaitRemote: true}); err != nil || !c.RemoteDurable {
		t.Fatalf("the new owner %s: checkpoint after failover: %v", now.name, err)
	}
	return took
}
