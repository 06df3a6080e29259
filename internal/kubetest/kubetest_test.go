package kubetest

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
)

// The deps script builds the release this package starts.
func TestDepsScriptVersion(t *testing.T) {
	b, err := os.ReadFile("../../scripts/deps.d/80-kube.sh")
	if err != nil {
		t.Fatal(err)
	}
	for v, want := range map[string]string{"_kube_ver": Version, "_etcd_ver": EtcdVersion} {
		m := regexp.MustCompile(`(?m)^` + v + `=(\S+)`).FindSubmatch(b)
		if m == nil || string(m[1]) != want {
			t.Errorf("scripts/deps.d/80-kube.sh sets %s to %q, kubetest wants %q", v, m, want)
		}
	}
}

const widgetCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.kubetest.turnsnap.dev
spec:
  group: kubetest.turnsnap.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                size: {type: integer, minimum: 1}
`

// A real API server of the pinned release: it serves its version, installs
// CRDs from a directory and validates their schema, and authorizes with
// RBAC (a user with no role is refused).
func TestStartRealAPIServer(t *testing.T) {
	crds := t.TempDir()
	if err := os.WriteFile(filepath.Join(crds, "widget.yaml"), []byte(widgetCRD), 0o644); err != nil {
		t.Fatal(err)
	}
	env := Start(t, Options{CRDDirs: []string{crds}})
	ctx := context.Background()
	v, err := env.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v != Version {
		t.Fatalf("API server version %q, want %q (%s)", v, Version, BinaryVersion())
	}
	if len(env.CRDs) != 1 {
		t.Fatalf("installed %d CRDs, want 1", len(env.CRDs))
	}
	w := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubetest.turnsnap.dev/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "w", "namespace": "default"},
		"spec":     map[string]any{"size": int64(0)},
	}}
	if err := env.Client.Create(ctx, w); !apierrors.IsInvalid(err) {
		t.Fatalf("a Widget against its schema (size 0 < minimum 1): %v, want Invalid", err)
	}
	w.Object["spec"] = map[string]any{"size": int64(2)}
	if err := env.Client.Create(ctx, w); err != nil {
		t.Fatal(err)
	}

	u := env.AddUser(t, "nobody")
	cs, err := kubernetes.NewForConfig(u.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("a user with no role listing Secrets: %v, want Forbidden", err)
	}
	if _, err := os.Stat(u.Kubeconfig); err != nil {
		t.Fatal(err)
	}
}

// Every manifest of deploy/kubernetes is accepted by the real API server:
// the CRDs (crd/, when present) installed for real, the namespace created
// for real (a namespaced object is refused in a namespace that does not
// exist, even in a dry run), everything else as a server-side dry run.
func TestManifestsApply(t *testing.T) {
	const dir = "../../deploy/kubernetes"
	objs, err := ReadManifests(dir)
	if err != nil {
		t.Fatal(err)
	}
	var crdDirs []string
	if _, err := os.Stat(filepath.Join(dir, "crd")); err == nil {
		crdDirs = append(crdDirs, filepath.Join(dir, "crd"))
	} else {
		t.Logf("no %s/crd yet: CRDs not installed", dir)
	}
	env := Start(t, Options{CRDDirs: crdDirs})
	ctx := context.Background()
	t.Logf("%d CRDs installed from crd/", len(env.CRDs))

	kinds := map[string]int{}
	var namespaces, rest []Object
	for _, o := range objs {
		kinds[o.GetKind()]++
		if o.GetKind() == "Namespace" {
			namespaces = append(namespaces, o)
		} else {
			rest = append(rest, o)
		}
	}
	for kind, n := range map[string]int{"Namespace": 1, "ServiceAccount": 2, "Role": 2, "RoleBinding": 2,
		"ClusterRole": 1, "ClusterRoleBinding": 1, "DaemonSet": 1, "Deployment": 1, "ConfigMap": 1} {
		if kinds[kind] < n {
			t.Errorf("deploy/kubernetes has %d %s, want at least %d", kinds[kind], kind, n)
		}
	}
	if err := Create(ctx, env.Client, namespaces, false); err != nil {
		t.Fatal(err)
	}
	if err := Create(ctx, env.Client, rest, true); err != nil {
		t.Fatalf("server-side dry run: %v", err)
	}
	// A dry run stores nothing.
	var sas corev1.ServiceAccountList
	if err := env.Client.List(ctx, &sas); err != nil {
		t.Fatal(err)
	}
	for _, sa := range sas.Items {
		if sa.Namespace == "turnsnap-system" && sa.Name != "default" {
			t.Errorf("the dry run stored ServiceAccount %s", sa.Name)
		}
	}
	t.Logf("accepted: %v", kinds)
}
