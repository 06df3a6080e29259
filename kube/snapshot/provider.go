// Package snapshot is EXPERIMENTAL: the node agent's snapshot provider for
// kubernetes-sigs/agent-sandbox, the SnapshotDriver gRPC service that
// KEP-0694 (an open proposal) asks a pluggable snapshot driver to serve:
// Checkpoint, Restore and Delete. `turnsnap serve --snapshot-grpc ADDR`
// serves it beside the HTTP API, on the same home's server.Service: each
// RPC is the HTTP API's call (checkpoint, rollback or branch, and a
// one-checkpoint forget), not a second implementation. The proto
// (kube/snapshot/v1alpha1) follows the proposal's text of 2026-07-01 and
// changes when it does; docs/SNAPSHOT-GRPC.md says where it departs.
package snapshot

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	pb "github.com/turnsnap/turnsnap/kube/snapshot/v1alpha1"
	"github.com/turnsnap/turnsnap/server"
)

// ParamWaitRemoteDurable is the SnapshotClass parameter that asks
// Checkpoint to wait until the checkpoint is in the shared bucket: the
// proposal's controller sends only its own fields and the class's
// parameters, so this is how a class asks for remote durability.
const ParamWaitRemoteDurable = "waitRemoteDurable"

// Provider is the SnapshotDriver service over one home's service.
type Provider struct {
	pb.UnimplementedSnapshotDriverServer
	svc *server.Service
}

// NewProvider serves svc's home.
func NewProvider(svc *server.Service) *Provider { return &Provider{svc: svc} }

// Checkpoint closes the sandbox's turn (server.Service.Checkpoint).
func (p *Provider) Checkpoint(ctx context.Context, req *pb.CheckpointRequest) (*pb.CheckpointResponse, error) {
	name := req.GetSandboxName()
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "checkpoint: sandbox_name is empty")
	}
	wait := req.GetWaitRemoteDurable()
	if v, ok := req.GetParameters()[ParamWaitRemoteDurable]; ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "checkpoint of sandbox %s: parameter %s=%q is not true or false", name, ParamWaitRemoteDurable, v)
		}
		wait = wait || b
	}
	cp, err := p.svc.Checkpoint(ctx, name, api.CheckpointRequest{Message: req.GetMessage(), WaitRemote: wait})
	if err != nil {
		return nil, statusOf(err)
	}
	return &pb.CheckpointResponse{
		SnapshotUid: string(cp.ID),
		SizeBytes:   cp.BytesNew,
		DriverMetadata: map[string]string{
			"class": string(cp.Class), "turn": strconv.Itoa(cp.Turn), "parent": string(cp.Parent),
			"remote_durable": strconv.FormatBool(cp.RemoteDurable),
		},
		Class: string(cp.Class), RemoteDurable: cp.RemoteDurable, SandboxName: cp.Sandbox,
		Turn: int64(cp.Turn), ParentUid: string(cp.Parent),
	}, nil
}

// Restore branches the checkpoint into a new sandbox, or rolls its own
// sandbox back to it (server.Service.Branch, .Rollback).
func (p *Provider) Restore(ctx context.Context, req *pb.RestoreRequest) (*pb.RestoreResponse, error) {
	id, err := fullID(req.GetSnapshotUid())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "restore: %v", err)
	}
	name := req.GetSandboxName()
	if name == "" {
		return nil, status.Errorf(codes.InvalidArgument, "restore of checkpoint %s: sandbox_name is empty", id.Short())
	}
	cp, err := p.svc.GetCheckpoint(ctx, id.String())
	if err != nil {
		return nil, statusOf(err)
	}
	var r *api.Restore
	mode := "branch"
	if cp.Sandbox == name {
		mode = "rollback"
		r, err = p.svc.Rollback(ctx, name, api.RollbackRequest{Checkpoint: id.String()})
	} else {
		var rs []api.Restore
		if rs, err = p.svc.Branch(ctx, id.String(), api.BranchRequest{Name: name}); err == nil {
			r = &rs[0]
		}
	}
	if err != nil {
		return nil, statusOf(err)
	}
	out := &pb.RestoreResponse{Mode: mode, Root: r.Root, Receipt: receiptOf(r.Receipt),
		RestoreMetadata: map[string]string{"mode": mode, "root": r.Root}}
	if r.Receipt != nil {
		out.RestoreMetadata["receipt_ok"] = strconv.FormatBool(r.Receipt.OK)
	}
	return out, nil
}

// Delete forgets one checkpoint under the retention rules
// (server.Service.ForgetCheckpoint); with a shared bucket it is marked
// and deleted after the usual grace.
func (p *Provider) Delete(ctx context.Context, req *pb.DeleteRequest) (*pb.DeleteResponse, error) {
	id, err := fullID(req.GetSnapshotUid())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "delete: %v", err)
	}
	f, err := p.svc.ForgetCheckpoint(ctx, id.String(), nil)
	if err != nil {
		return nil, statusOf(err)
	}
	out := &pb.DeleteResponse{}
	for _, s := range f.Sandboxes {
		for _, e := range s.Deleted {
			out.Deleted = out.Deleted || string(e.ID) == id.String()
		}
		for _, e := range s.Marked {
			if string(e.ID) == id.String() {
				out.Marked = true
				if !e.DeleteAfter.IsZero() {
					out.DeleteAfter = e.DeleteAfter.UTC().Format(time.RFC3339)
				}
			}
		}
	}
	if !out.Deleted && !out.Marked {
		// The bucket's mark object is full: nothing was lost, and a
		// later Delete retries.
		return nil, status.Errorf(codes.Unavailable, "delete of checkpoint %s: left for a later run (the bucket's mark object is full)", id.Short())
	}
	return out, nil
}

// fullID parses a snapshot_uid: a full checkpoint id in lowercase hex, as
// Checkpoint returns it. Prefixes, tags and HEAD forms, which the CLI
// accepts, are refused: a driver handle names one checkpoint for good.
func fullID(s string) (delta.ID, error) {
	id, err := delta.ParseID(s)
	if err != nil {
		return id, fmt.Errorf("snapshot_uid %q: not a full checkpoint id (64 lowercase hex digits)", s)
	}
	if id.String() != s {
		return id, fmt.Errorf("snapshot_uid %q: not in lowercase", s)
	}
	return id, nil
}

func receiptOf(r *api.Receipt) *pb.Receipt {
	if r == nil {
		return nil
	}
	out := &pb.Receipt{Kind: r.Kind, SandboxName: r.Sandbox, SnapshotUid: string(r.Checkpoint), Ok: r.OK,
		WantState: string(r.Files.WantState), GotState: string(r.Files.GotState), FilesMatch: r.Files.Match,
		NotRestored: r.NotRestored}
	if r.Processes != nil {
		out.ProcessesRestored, out.ProcessesMatch = true, r.Processes.Match
	}
	return out
}

// codeOf is each errdefs class's gRPC code; a class not here is Internal.
var codeOf = map[string]codes.Code{
	"invalid":      codes.InvalidArgument,
	"not_found":    codes.NotFound,
	"exists":       codes.AlreadyExists,
	"precondition": codes.FailedPrecondition, // fenced, another home's, kept
	"unavailable":  codes.Unavailable,
	"key":          codes.PermissionDenied,
	"corrupt":      codes.DataLoss,
	"no_space":     codes.ResourceExhausted,
	// A restore that ran and made something else than the checkpoint.
	"restore_incomplete": codes.Internal,
}

// statusOf is err as a gRPC status: its class's code and its message
// (which names the sandbox or checkpoint).
func statusOf(err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	c, ok := codeOf[errdefs.Class(err)]
	if !ok {
		c = codes.Internal
	}
	return status.Error(c, err.Error())
}
