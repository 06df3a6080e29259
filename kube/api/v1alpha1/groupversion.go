// Package v1alpha1 is turnsnap's Kubernetes API, group turnsnap.dev,
// version v1alpha1 (docs/KUBERNETES.md): TurnsnapSandbox (a sandbox placed
// on a node agent), SandboxCheckpoint (a checkpoint of one) and SandboxFork
// (one checkpoint branched into many sandboxes over the nodes).
//
// The CRDs under deploy/kubernetes/crd/ and zz_generated.deepcopy.go are
// generated from these types by controller-gen (make kube-generate); a test
// fails when the committed files are stale.
//
// +kubebuilder:object:generate=true
// +groupName=turnsnap.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

// GroupVersion is the API's group and version.
var GroupVersion = schema.GroupVersion{Group: "turnsnap.dev", Version: "v1alpha1"}

// SchemeBuilder registers the types; AddToScheme adds them to a scheme.
var (
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}
	AddToScheme   = SchemeBuilder.AddToScheme
)
