package server_test

import (
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// docRoutes reads docs/openapi.yaml's operations as mux patterns.
func docRoutes(t *testing.T) []string {
	_, file, _, _ := runtime.Caller(0)
	data, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "docs", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OpenAPI string                          `yaml:"openapi"`
		Paths   map[string]map[string]yaml.Node `yaml:"paths"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1") {
		t.Fatalf("docs/openapi.yaml is OpenAPI %q, want 3.1", doc.OpenAPI)
	}
	var out []string
	for path, ops := range doc.Paths {
		for method := range ops {
			switch method {
			case "get", "put", "post", "delete", "patch", "head", "options":
				out = append(out, strings.ToUpper(method)+" "+path)
			}
		}
	}
	sort.Strings(out)
	return out
}

// Every route the server registers is in docs/openapi.yaml, and every
// documented route exists.
func TestOpenAPICoversRoutes(t *testing.T) {
	f := serve(t, nil)
	served := map[string]bool{}
	for _, r := range f.srv.Routes() {
		served[r] = true
	}
	documented := map[string]bool{}
	for _, r := range docRoutes(t) {
		documented[r] = true
		if !served[r] {
			t.Errorf("docs/openapi.yaml documents %s, which the server does not serve", r)
		}
	}
	for r := range served {
		if !documented[r] {
			t.Errorf("route %s is missing from docs/openapi.yaml", r)
		}
	}
	if len(served) < 25 {
		t.Fatalf("only %d routes registered: %v", len(served), f.srv.Routes())
	}
}
