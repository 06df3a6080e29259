// Package snapshotv1alpha1 is EXPERIMENTAL: the generated Go of
// snapshot.proto, turnsnap's server side of the snapshot driver gRPC
// interface proposed by kubernetes-sigs/agent-sandbox KEP-0694 (Checkpoint,
// Restore, Delete). The proposal is open and may change; so may this
// package, without compatibility promises. Package kube/snapshot serves it.
package snapshotv1alpha1

// protoc 3.21 (Debian's protobuf-compiler), protoc-gen-go v1.36.12,
// protoc-gen-go-grpc v1.6.2.
//go:generate protoc -I . --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative snapshot.proto
