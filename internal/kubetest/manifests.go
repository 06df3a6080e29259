package kubetest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Object is one object of a manifest file, and where it came from.
type Object struct {
	*unstructured.Unstructured
	File string
}

// String names the object and its file, for messages.
func (o Object) String() string {
	return fmt.Sprintf("%s %s/%s (%s)", o.GetKind(), o.GetNamespace(), o.GetName(), filepath.Base(o.File))
}

// ReadManifests decodes every object in the YAML files (*.yaml, *.yml)
// directly in dir, in file-name order; subdirectories (crd/) are not read.
// A document without apiVersion and kind is an error.
func ReadManifests(dir string) ([]Object, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		if !e.IsDir() && (strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".yml")) {
			files = append(files, filepath.Join(dir, e.Name()))
		}
	}
	sort.Strings(files)
	var out []Object
	for _, f := range files {
		objs, err := ReadManifestFile(f)
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
	return out, nil
}

// ReadManifestFile decodes every object in one YAML file.
func ReadManifestFile(path string) ([]Object, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	// The apimachinery decoder: YAML documents separated by ---, as
	// kubectl reads them.
	dec := utilyaml.NewYAMLOrJSONDecoder(bufio.NewReader(fh), 4096)
	var out []Object
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(m) == 0 {
			continue // an empty document
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetAPIVersion() == "" || u.GetKind() == "" {
			return nil, fmt.Errorf("%s: a document without apiVersion or kind (%s)", path, u.GetName())
		}
		out = append(out, Object{Unstructured: u, File: path})
	}
}

// Create creates each object with c, as a server-side dry run when
// dryRun (DryRun: All: the API server validates, defaults and admits the
// object, RBAC included, and stores nothing). It stops at the first
// object refused.
func Create(ctx context.Context, c client.Client, objs []Object, dryRun bool) error {
	var opts []client.CreateOption
	if dryRun {
		opts = append(opts, client.DryRunAll)
	}
	for _, o := range objs {
		if err := c.Create(ctx, o.DeepCopy(), opts...); err != nil {
			return fmt.Errorf("%s: %w", o, err)
		}
	}
	return nil
}
