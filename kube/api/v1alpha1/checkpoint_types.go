package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SandboxCheckpointSpec asks for a checkpoint of a sandbox now, or records
// one its node already took (CheckpointID).
//
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable"
type SandboxCheckpointSpec struct {
	// SandboxRef is the TurnsnapSandbox, in this namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	SandboxRef string `json:"sandboxRef"`
	// CheckpointID records a checkpoint the node took (a turn the daemon
	// closed itself, through its LLM proxy say) instead of taking one.
	// +optional
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{8,64}$`
	CheckpointID string `json:"checkpointID,omitempty"`
	// Message is the checkpoint's message.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
	// Local, set, does not wait for the checkpoint to be in the bucket.
	// +optional
	Local bool `json:"local,omitempty"`
}

// CheckpointPhase is where a checkpoint request is.
// +kubebuilder:validation:Enum=Pending;Completed;Failed
type CheckpointPhase string

// The phases of a SandboxCheckpoint.
const (
	CheckpointPending   CheckpointPhase = "Pending"
	CheckpointCompleted CheckpointPhase = "Completed"
	CheckpointFailed    CheckpointPhase = "Failed"
)

// SandboxCheckpointStatus is the checkpoint taken.
type SandboxCheckpointStatus struct {
	// +optional
	Phase CheckpointPhase `json:"phase,omitempty"`
	// ID is the checkpoint's id.
	// +optional
	ID string `json:"id,omitempty"`
	// Class is skip, fs, process or full (docs/ARCHITECTURE.md).
	// +optional
	Class string `json:"class,omitempty"`
	// Turn is the checkpoint's turn number.
	// +optional
	Turn int64 `json:"turn,omitempty"`
	// Bytes are the new bytes the checkpoint stored.
	// +optional
	Bytes int64 `json:"bytes,omitempty"`
	// RemoteDurable: the checkpoint is in the bucket, so any node restores it.
	// +optional
	RemoteDurable bool `json:"remoteDurable,omitempty"`
	// Node took the checkpoint.
	// +optional
	Node string `json:"node,omitempty"`
	// Receipt is what every restore of this checkpoint must prove: its
	// state key (a restore's receipt.want), taken from the node's record.
	// +optional
	Receipt *Receipt `json:"receipt,omitempty"`
	// Message says why the checkpoint failed.
	// +optional
	Message string `json:"message,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// SandboxCheckpoint is one checkpoint of a TurnsnapSandbox.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=tscp,categories=turnsnap
// +kubebuilder:printcolumn:name="Sandbox",type=string,JSONPath=`.spec.sandboxRef`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="ID",type=string,JSONPath=`.status.id`
// +kubebuilder:printcolumn:name="Class",type=string,JSONPath=`.status.class`
// +kubebuilder:printcolumn:name="Durable",type=boolean,JSONPath=`.status.remoteDurable`
type SandboxCheckpoint struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SandboxCheckpointSpec   `json:"spec"`
	Status SandboxCheckpointStatus `json:"status,omitempty"`
}

// SandboxCheckpointList is a list of SandboxCheckpoint.
//
// +kubebuilder:object:root=true
type SandboxCheckpointList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxCheckpoint `json:"items"`
}
