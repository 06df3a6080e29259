package v1alpha1

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// crdDir holds the committed CRDs, generated from these types.
const crdDir = "../../../deploy/kubernetes/crd"

// controllerGen is the generator and version the committed files come from.
const controllerGen = "sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0"

func readCRD(t *testing.T, plural string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(crdDir, "turnsnap.dev_"+plural+".yaml"))
	if err != nil {
		t.Fatalf("reading the committed CRD (make kube-generate writes it): %v", err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(b, &crd); err != nil {
		t.Fatalf("CRD %s: %v", plural, err)
	}
	return &crd
}

// TestCRDsMatchTheTypes is the cheap check that the committed CRDs are not
// stale: every JSON field of each Go type, at every depth, is a property of
// the CRD's schema and the schema has no other, the status subresource is
// on, and the kinds and the group are the types'. A field added to a type
// without `make kube-generate` fails here. (TestCRDsRegenerate compares
// whole files, with the generator.)
func TestCRDsMatchTheTypes(t *testing.T) {
	for _, c := range []struct {
		plural string
		obj    any
	}{
		{"turnsnapsandboxes", TurnsnapSandbox{}},
		{"sandboxcheckpoints", SandboxCheckpoint{}},
		{"sandboxforks", SandboxFork{}},
	} {
		crd := readCRD(t, c.plural)
		typ := reflect.TypeOf(c.obj)
		if crd.Spec.Group != GroupVersion.Group || crd.Spec.Names.Kind != typ.Name() {
			t.Errorf("CRD %s: group %s kind %s; want %s %s", c.plural, crd.Spec.Group, crd.Spec.Names.Kind, GroupVersion.Group, typ.Name())
		}
		if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != GroupVersion.Version {
			t.Fatalf("CRD %s: versions %v; want only %s", c.plural, crd.Spec.Versions, GroupVersion.Version)
		}
		v := crd.Spec.Versions[0]
		if v.Subresources == nil || v.Subresources.Status == nil {
			t.Errorf("CRD %s has no status subresource", c.plural)
		}
		root := v.Schema.OpenAPIV3Schema
		for _, part := range []string{"spec", "status"} {
			f, _ := typ.FieldByName(strings.ToUpper(part[:1]) + part[1:])
			prop, ok := root.Properties[part]
			if !ok {
				t.Errorf("CRD %s has no %s", c.plural, part)
				continue
			}
			compare(t, c.plural+"."+part, f.Type, &prop)
		}
	}
}

// compare walks a Go type and its schema together.
func compare(t *testing.T, at string, typ reflect.Type, s *apiextensionsv1.JSONSchemaProps) {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	switch typ {
	case reflect.TypeOf(metav1.Time{}), reflect.TypeOf(metav1.Condition{}):
		return // the apimachinery's own types
	}
	switch typ.Kind() {
	case reflect.Slice:
		if typ.Elem().Kind() == reflect.Uint8 {
			return
		}
		if s.Items == nil || s.Items.Schema == nil {
			t.Errorf("%s: a list in the type, no items in the CRD", at)
			return
		}
		compare(t, at+"[]", typ.Elem(), s.Items.Schema)
	case reflect.Map:
		if s.AdditionalProperties == nil || s.AdditionalProperties.Schema == nil {
			t.Errorf("%s: a map in the type, not in the CRD", at)
		}
	case reflect.Struct:
		if strings.HasPrefix(typ.PkgPath(), "k8s.io/") {
			return // corev1.ResourceRequirements and the like: Kubernetes' schema
		}
		want := map[string]reflect.Type{}
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				continue
			}
			want[name] = f.Type
		}
		var missing, extra []string
		for name, ft := range want {
			p, ok := s.Properties[name]
			if !ok {
				missing = append(missing, name)
				continue
			}
			compare(t, at+"."+name, ft, &p)
		}
		for name := range s.Properties {
			if _, ok := want[name]; !ok {
				extra = append(extra, name)
			}
		}
		sort.Strings(missing)
		sort.Strings(extra)
		if len(missing)+len(extra) > 0 {
			t.Errorf("%s: the committed CRD is stale (run make kube-generate): fields not in it %v, fields only in it %v", at, missing, extra)
		}
	}
}

// TestCRDsRegenerate runs controller-gen and compares its output with the
// committed files, byte for byte. It builds the generator from the module
// proxy the first time, so it runs only with TURNSNAP_KUBE_REGEN=1 (make
// kube-generate-check, in CI).
func TestCRDsRegenerate(t *testing.T) {
	if os.Getenv("TURNSNAP_KUBE_REGEN") != "1" {
		t.Skip("set TURNSNAP_KUBE_REGEN=1 (make kube-generate-check) to regenerate and compare")
	}
	out := t.TempDir()
	cmd := exec.Command("go", "run", controllerGen, "crd", "paths=./kube/api/...", "output:crd:artifacts:config="+out)
	cmd.Dir = "../../.."
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("controller-gen: %v\n%s", err, b)
	}
	gen, err := filepath.Glob(filepath.Join(out, "*.yaml"))
	if err != nil || len(gen) == 0 {
		t.Fatalf("controller-gen wrote nothing: %v", err)
	}
	committed, _ := filepath.Glob(filepath.Join(crdDir, "*.yaml"))
	if len(committed) != len(gen) {
		t.Errorf("controller-gen writes %d CRDs, %d are committed", len(gen), len(committed))
	}
	for _, g := range gen {
		want, _ := os.ReadFile(g)
		got, err := os.ReadFile(filepath.Join(crdDir, filepath.Base(g)))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run make kube-generate", filepath.Base(g))
		}
	}
}
