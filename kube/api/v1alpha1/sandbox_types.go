package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Backend is the kind of a sandbox's root on its node.
// +kubebuilder:validation:Enum=overlay;btrfs
type Backend string

// The backends (docs/ARCHITECTURE.md: overlay, btrfs).
const (
	BackendOverlay Backend = "overlay"
	BackendBtrfs   Backend = "btrfs"
)

// RestoreMode is how a sandbox made from a checkpoint (a resume, a
// branch, a fork's child) gets its files on its node.
// +kubebuilder:validation:Enum=Auto;Lazy;Full
type RestoreMode string

// The restore modes (docs/KUBERNETES.md, "Lazy restore").
const (
	// RestoreAuto is Lazy when the checkpoint allows it (an overlay root,
	// no processes), else Full.
	RestoreAuto RestoreMode = "Auto"
	// RestoreLazy starts the sandbox once the checkpoint's metadata is on
	// the node: each file is fetched on its first access, the rest in the
	// background. A checkpoint with processes, or a btrfs root, fails.
	RestoreLazy RestoreMode = "Lazy"
	// RestoreFull writes every byte and checks the root against the
	// checkpoint (the receipt) before the sandbox runs.
	RestoreFull RestoreMode = "Full"
)

// TurnsnapSandboxSpec is what the user wants of a sandbox.
//
// +kubebuilder:validation:XValidation:rule="has(self.base) != has(self.fromCheckpoint)",message="give exactly one of base and fromCheckpoint"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.base) || (has(self.base) && self.base == oldSelf.base)",message="base is immutable"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.fromCheckpoint) || (has(self.fromCheckpoint) && self.fromCheckpoint == oldSelf.fromCheckpoint)",message="fromCheckpoint is immutable"
type TurnsnapSandboxSpec struct {
	// Base is the directory on the node the sandbox's root starts from
	// (the same path on every node: an image unpacked on a hostPath).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:Pattern=`^/`
	Base string `json:"base,omitempty"`
	// FromCheckpoint starts the sandbox as a branch of this checkpoint (a
	// checkpoint id in the shared bucket) instead of a base: a fork's
	// children are made so.
	// +optional
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{8,64}$`
	FromCheckpoint string `json:"fromCheckpoint,omitempty"`
	// Backend is the kind of root on the node.
	// +optional
	// +kubebuilder:default=overlay
	Backend Backend `json:"backend,omitempty"`
	// BtrfsPool is, for backend btrfs, a directory on a mounted btrfs on
	// the node.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	BtrfsPool string `json:"btrfsPool,omitempty"`
	// Resources are the sandbox's requests and limits. The controller
	// counts requests against a node's capacity when it places a sandbox;
	// the node agent does not enforce them yet.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
	// NodeName places the sandbox on this node (the node agent's name, as
	// its Lease turnsnap-node-NAME says) whenever it starts or resumes;
	// failover from a dead node places it on any live node that
	// NodeSelector matches.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName,omitempty"`
	// NodeSelector restricts placement to nodes whose Node object carries
	// these labels.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Suspend, set, takes a remote-durable final checkpoint and frees the
	// node; cleared, the sandbox is restored on a live node from the
	// bucket.
	// +optional
	Suspend bool `json:"suspend,omitempty"`
	// Restore is how a resume or a branch brings the checkpoint's files
	// onto the node.
	// +optional
	// +kubebuilder:default=Auto
	Restore RestoreMode `json:"restore,omitempty"`
}

// SandboxPhase is where a sandbox is in its life.
// +kubebuilder:validation:Enum=Pending;Running;Suspended;Failed
type SandboxPhase string

// The phases of a TurnsnapSandbox.
const (
	SandboxPending   SandboxPhase = "Pending"
	SandboxRunning   SandboxPhase = "Running"
	SandboxSuspended SandboxPhase = "Suspended"
	SandboxFailed    SandboxPhase = "Failed"
)

// Condition types of a TurnsnapSandbox.
const (
	// ConditionPlaced: the sandbox runs on a live node (or, false, why not).
	ConditionPlaced = "Placed"
	// ConditionSuspended: the sandbox's final checkpoint is in the bucket
	// and no node holds it.
	ConditionSuspended = "Suspended"
	// ConditionFilled: every file of the sandbox's last restore is on its
	// node; false while a lazy restore still fetches, or names the object
	// a fill could not read.
	ConditionFilled = "Filled"
)

// Receipt is the summary of a restore's receipt (the node agent's
// api.Receipt): what the restore made, checked against its checkpoint.
type Receipt struct {
	// Kind is create, branch, adopt or rollback.
	Kind string `json:"kind"`
	// Checkpoint is the checkpoint restored.
	Checkpoint string `json:"checkpoint"`
	// OK: the restored root (and processes) are the checkpoint's.
	OK bool `json:"ok"`
	// Tree is the checkpoint's layer tree (a SandboxCheckpoint's id of
	// what every restore of it must reproduce).
	// +optional
	Tree string `json:"tree,omitempty"`
	// Want and Got are the checkpoint's state key and the state key a
	// scan of the restored root found (docs/FORMAT.md).
	// +optional
	Want string `json:"want,omitempty"`
	// +optional
	Got string `json:"got,omitempty"`
	// Processes: processes were restored, and their inventory matched.
	// +optional
	Processes bool `json:"processes,omitempty"`
	// Mismatch names the first difference when not OK.
	// +optional
	Mismatch string `json:"mismatch,omitempty"`
	// Lazy: the sandbox started before its files' bytes were on the node.
	// Its names and metadata were written from the checkpoint's checked
	// trees and each file is hash-checked as it is filled; no scan of the
	// root is made (the sandbox runs meanwhile), so Want and Got are
	// empty. The Filled condition tells when every file is there.
	// +optional
	Lazy bool `json:"lazy,omitempty"`
}

// TurnsnapSandboxStatus is what the controller observed.
type TurnsnapSandboxStatus struct {
	// ObservedGeneration is the generation of the spec last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	Phase SandboxPhase `json:"phase,omitempty"`
	// Node runs the sandbox now; empty while pending or suspended.
	// +optional
	Node string `json:"node,omitempty"`
	// Home is the id of the node agent's home that owns the sandbox.
	// +optional
	Home string `json:"home,omitempty"`
	// SandboxName is the sandbox's name on its node agent.
	// +optional
	SandboxName string `json:"sandboxName,omitempty"`
	// Action is what the controller is doing on Node (create, branch,
	// resume, adopt), recorded before it calls the node so that a
	// restarted controller finishes it instead of starting it elsewhere.
	// +optional
	Action string `json:"action,omitempty"`
	// Head is the sandbox's newest checkpoint the controller knows.
	// +optional
	Head string `json:"head,omitempty"`
	// DurableCheckpoint is the newest checkpoint known to be in the
	// bucket: what suspend left, and what resume and failover restore.
	// +optional
	DurableCheckpoint string `json:"durableCheckpoint,omitempty"`
	// SuspendTag is the tag that keeps the suspended checkpoint from
	// retention while no sandbox's head names it.
	// +optional
	SuspendTag string `json:"suspendTag,omitempty"`
	// Failovers counts restores from a dead node.
	// +optional
	Failovers int32 `json:"failovers,omitempty"`
	// LastRestore is the newest restore onto a node.
	// +optional
	LastRestore *Receipt `json:"lastRestore,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// TurnsnapSandbox is a sandbox that the controller places on a node agent
// and keeps there: suspended and resumed anywhere, restored elsewhere when
// its node dies.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=tsb,categories=turnsnap
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.node`
// +kubebuilder:printcolumn:name="Head",type=string,JSONPath=`.status.head`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TurnsnapSandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TurnsnapSandboxSpec   `json:"spec"`
	Status TurnsnapSandboxStatus `json:"status,omitempty"`
}

// TurnsnapSandboxList is a list of TurnsnapSandbox.
//
// +kubebuilder:object:root=true
type TurnsnapSandboxList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TurnsnapSandbox `json:"items"`
}
