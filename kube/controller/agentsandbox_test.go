package controller

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	asv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	v1 "github.com/turnsnap/turnsnap/kube/api/v1alpha1"
)

// agentSandboxCRDs is the directory of agent-sandbox's CRDs in its module
// (the version go.mod names).
func agentSandboxCRDs(t testing.TB) string {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/agent-sandbox")
	cmd.Dir = repoRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("locating module sigs.k8s.io/agent-sandbox: %v", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "k8s", "crds")
}

// agentSandbox is a Sandbox as a platform on agent-sandbox makes it.
func agentSandbox(name string, annotations map[string]string, runtimeClass string, mode asv1.SandboxOperatingMode) *asv1.Sandbox {
	s := &asv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "work", Annotations: annotations}}
	s.Spec.PodTemplate.Spec.Containers = []corev1.Container{{Name: "agent", Image: "debian:trixie"}}
	if runtimeClass != "" {
		s.Spec.PodTemplate.Spec.RuntimeClassName = &runtimeClass
	}
	s.Spec.OperatingMode = mode
	return s
}

// turnsnapCondition waits until the Sandbox's ConditionTurnsnap has the
// reason and returns it.
func turnsnapCondition(t testing.TB, f *fleet, name, reason string) *metav1.Condition {
	t.Helper()
	s := waitFor(t, f, &asv1.Sandbox{}, name, wait, func(s *asv1.Sandbox) bool {
		c := meta.FindStatusCondition(s.Status.Conditions, ConditionTurnsnap)
		return c != nil && c.Reason == reason
	})
	return meta.FindStatusCondition(s.Status.Conditions, ConditionTurnsnap)
}

// TestAgentSandbox drives turnsnap through agent-sandbox's Sandbox against
// a real API server (with agent-sandbox v1.0.1's CRDs) and two real node
// agents. No agent-sandbox controller runs: the test plays the platform's
// part (it writes the Sandbox and its operatingMode) and nothing makes
// Pods; nor does a garbage collector run, so ownership is checked on the
// object and not by deleting the Sandbox. The controller runs as its
// ServiceAccount with deploy/kubernetes/rbac.yaml applied.
func TestAgentSandbox(t *testing.T) {
	f := newFleet(t, 2, agentSandboxCRDs(t))
	f.asController()
	f.startController()
	ctx := context.Background()

	// Not opted in: a base annotation alone is not the opt-in.
	plain := agentSandbox("plain", map[string]string{AnnotationBase: f.base}, "", "")
	if err := f.k.Create(ctx, plain); err != nil {
		t.Fatal(err)
	}
	// Opted in by its runtime class, created suspended: a TurnsnapSandbox
	// that no node holds.
	asleep := agentSandbox("asleep", map[string]string{AnnotationBase: f.base}, RuntimeClassTurnsnap, asv1.SandboxOperatingModeSuspended)
	if err := f.k.Create(ctx, asleep); err != nil {
		t.Fatal(err)
	}
	// Opted in by annotation, running.
	s := agentSandbox("agent", map[string]string{AnnotationManaged: "true", AnnotationBase: f.base}, "", "")
	if err := f.k.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := f.k.Get(ctx, crclient.ObjectKeyFromObject(s), s); err != nil {
		t.Fatal(err)
	}
	if s.Spec.OperatingMode != asv1.SandboxOperatingModeRunning {
		t.Fatalf("operatingMode defaulted to %q; want Running (agent-sandbox's CRD default)", s.Spec.OperatingMode)
	}

	tsb := waitFor(t, f, &v1.TurnsnapSandbox{}, "agent", wait, running)
	if !metav1.IsControlledBy(tsb, s) || tsb.Spec.Base != f.base || tsb.Spec.Suspend {
		t.Fatalf("TurnsnapSandbox: owners %+v, spec %+v; want controlled by Sandbox %s, base %s, running", tsb.OwnerReferences, tsb.Spec, s.UID, f.base)
	}
	first := tsb.Status.Node
	c := turnsnapCondition(t, f, "agent", "Running")
	if c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "node "+first) {
		t.Fatalf("Sandbox condition %+v; want True, naming node %s", c, first)
	}
	root := rootOf(t, f, tsb)
	writeFile(t, filepath.Join(root, "work.txt"), "written through agent-sandbox\n")

	as := waitFor(t, f, &v1.TurnsnapSandbox{}, "asleep", wait, func(x *v1.TurnsnapSandbox) bool { return x.Status.Phase == v1.SandboxSuspended })
	if !as.Spec.Suspend || as.Status.Node != "" {
		t.Fatalf("Sandbox created Suspended: TurnsnapSandbox spec %+v status %+v; want suspended on no node", as.Spec, as.Status)
	}
	if c := turnsnapCondition(t, f, "asleep", "Suspended"); c.Status != metav1.ConditionTrue {
		t.Fatalf("suspended Sandbox's condition %+v", c)
	}
	// Both opted-in Sandboxes were reconciled; the plain one made nothing.
	if err := f.k.Get(ctx, crclient.ObjectKey{Namespace: "work", Name: "plain"}, &v1.TurnsnapSandbox{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a Sandbox without the opt-in got a TurnsnapSandbox: %v", err)
	}
	if err := f.k.Get(ctx, crclient.ObjectKeyFromObject(plain), plain); err != nil || len(plain.Status.Conditions) != 0 {
		t.Fatalf("a Sandbox without the opt-in was written to: %v, %+v", err, plain.Status)
	}

	// Ballast on the first node, so that the least loaded node at resume
	// is the other one: the resume must come from the bucket.
	newSandbox(t, f, "ballast", v1.TurnsnapSandboxSpec{Base: f.base, NodeName: first})

	setMode(t, f, "agent", asv1.SandboxOperatingModeSuspended)
	tsb = waitFor(t, f, &v1.TurnsnapSandbox{}, "agent", wait, func(x *v1.TurnsnapSandbox) bool { return x.Status.Phase == v1.SandboxSuspended })
	if !tsb.Spec.Suspend || tsb.Status.Node != "" || tsb.Status.DurableCheckpoint == "" || tsb.Status.SuspendTag == "" {
		t.Fatalf("suspended: spec %+v status %+v; want suspend, no node, a durable checkpoint kept by a tag", tsb.Spec, tsb.Status)
	}
	if _, err := f.agentNamed(first).c.GetSandbox(ctx, tsb.Status.SandboxName); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("node %s still holds the suspended sandbox: %v", first, err)
	}
	c = turnsnapCondition(t, f, "agent", "Suspended")
	if c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, short(tsb.Status.DurableCheckpoint)) {
		t.Fatalf("suspended Sandbox's condition %+v; want True, naming checkpoint %s", c, short(tsb.Status.DurableCheckpoint))
	}

	start := time.Now()
	setMode(t, f, "agent", asv1.SandboxOperatingModeRunning)
	tsb = waitFor(t, f, &v1.TurnsnapSandbox{}, "agent", wait, func(x *v1.TurnsnapSandbox) bool { return !x.Spec.Suspend && running(x) })
	t.Logf("resume through the Sandbox's operatingMode: %v, %s -> %s", time.Since(start), first, tsb.Status.Node)
	if tsb.Status.Node == first || tsb.Status.LastRestore == nil || !tsb.Status.LastRestore.OK || tsb.Status.LastRestore.Kind != actionResume {
		t.Fatalf("resumed: status %+v, restore %+v; want an OK resume on a node other than %s", tsb.Status, tsb.Status.LastRestore, first)
	}
	if got := readFile(t, filepath.Join(rootOf(t, f, tsb), "work.txt")); got != "written through agent-sandbox\n" {
		t.Fatalf("resumed sandbox's work.txt: %q", got)
	}
	c = turnsnapCondition(t, f, "agent", "Running")
	if c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "node "+tsb.Status.Node) {
		t.Fatalf("resumed Sandbox's condition %+v; want True, naming node %s", c, tsb.Status.Node)
	}
}

// setMode sets the Sandbox's operatingMode, as the platform would.
func setMode(t testing.TB, f *fleet, name string, mode asv1.SandboxOperatingMode) {
	t.Helper()
	var s asv1.Sandbox
	if err := f.k.Get(context.Background(), crclient.ObjectKey{Namespace: "work", Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	patch := crclient.MergeFrom(s.DeepCopy())
	s.Spec.OperatingMode = mode
	if err := f.k.Patch(context.Background(), &s, patch); err != nil {
		t.Fatal(err)
	}
}
