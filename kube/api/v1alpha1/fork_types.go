package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxForkChildren bounds one fork (the node agent's fan-out bound).
const MaxForkChildren = 256

// SandboxForkSpec branches one checkpoint into many sandboxes.
//
// +kubebuilder:validation:XValidation:rule="has(self.checkpoint) != has(self.checkpointRef)",message="give exactly one of checkpoint and checkpointRef"
// +kubebuilder:validation:XValidation:rule="has(self.count) || has(self.names)",message="give count or names"
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable"
type SandboxForkSpec struct {
	// Checkpoint is the checkpoint's id in the bucket.
	// +optional
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{8,64}$`
	Checkpoint string `json:"checkpoint,omitempty"`
	// CheckpointRef names a SandboxCheckpoint in this namespace; the fork
	// waits until it is completed and remote-durable.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	CheckpointRef string `json:"checkpointRef,omitempty"`
	// Count makes children FORK-1 ... FORK-COUNT.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=256
	Count int32 `json:"count,omitempty"`
	// Names are the children's names instead (TurnsnapSandbox names).
	// +optional
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=63
	// +listType=set
	Names []string `json:"names,omitempty"`
	// Backend of the children's roots.
	// +optional
	// +kubebuilder:default=overlay
	Backend Backend `json:"backend,omitempty"`
	// NodeSelector restricts the children's nodes (Node labels).
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Restore is how each child gets the checkpoint's files (the
	// children's spec.restore).
	// +optional
	// +kubebuilder:default=Auto
	Restore RestoreMode `json:"restore,omitempty"`
}

// ForkPhase is where a fork is.
// +kubebuilder:validation:Enum=Pending;Forking;Completed;Failed
type ForkPhase string

// The phases of a SandboxFork.
const (
	ForkPending   ForkPhase = "Pending"
	ForkForking   ForkPhase = "Forking"
	ForkCompleted ForkPhase = "Completed"
	ForkFailed    ForkPhase = "Failed"
)

// ForkChild is one child of a fork.
type ForkChild struct {
	// Name is the child TurnsnapSandbox.
	Name string `json:"name"`
	// Node the child was placed on.
	// +optional
	Node string `json:"node,omitempty"`
	// +optional
	Phase SandboxPhase `json:"phase,omitempty"`
	// Receipt of the child's branch.
	// +optional
	Receipt *Receipt `json:"receipt,omitempty"`
}

// SandboxForkStatus says where each child is.
type SandboxForkStatus struct {
	// +optional
	Phase ForkPhase `json:"phase,omitempty"`
	// Checkpoint is the id forked (resolved from checkpointRef).
	// +optional
	Checkpoint string `json:"checkpoint,omitempty"`
	// Ready counts the children running.
	// +optional
	Ready int32 `json:"ready,omitempty"`
	// Children, in the order of their names.
	// +optional
	// +listType=map
	// +listMapKey=name
	Children []ForkChild `json:"children,omitempty"`
	// StartTime is when the controller first acted on the fork, and
	// CompletionTime when every child ran.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// SandboxFork branches one checkpoint into N TurnsnapSandboxes spread over
// the nodes.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=tsfork,categories=turnsnap
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.ready`
// +kubebuilder:printcolumn:name="Checkpoint",type=string,JSONPath=`.status.checkpoint`
type SandboxFork struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SandboxForkSpec   `json:"spec"`
	Status SandboxForkStatus `json:"status,omitempty"`
}

// SandboxForkList is a list of SandboxFork.
//
// +kubebuilder:object:root=true
type SandboxForkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxFork `json:"items"`
}
