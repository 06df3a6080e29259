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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API's group and version. (Package variables by the
// convention of Kubernetes API packages; nothing assigns them.)
var GroupVersion = schema.GroupVersion{Group: "turnsnap.dev", Version: "v1alpha1"}

// AddToScheme adds the types to a scheme.
func AddToScheme(s *runtime.Scheme) error {
	b := runtime.NewSchemeBuilder(addKnownTypes)
	return b.AddToScheme(s)
}

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&TurnsnapSandbox{}, &TurnsnapSandboxList{},
		&SandboxCheckpoint{}, &SandboxCheckpointList{},
		&SandboxFork{}, &SandboxForkList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
