package server

// The service's store-wide operations: verify, tags, status, sync,
// prune, gc, init and catalog rebuild.

import (
	"context"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/engine/retention"
)

func (s *Service) Verify(ctx context.Context, ref string) (*api.Verified, error) {
	cpRef, err := catalog.ParseCheckpointRef(ref)
	if err != nil {
		return nil, err
	}
	r, err := s.E.Verifier().Verify(ctx, cpRef)
	if err != nil {
		return nil, err
	}
	return &api.Verified{BaseChecked: r.BaseChecked, FrozenChecked: r.FrozenChecked, Bytes: r.Bytes, Checkpoint: idOf(r.Checkpoint), Chunks: r.Chunks,
		Entries: r.Entries, Objects: r.Objects, OK: true, StateBytes: r.StateBytes, Trees: r.Trees}, nil
}

func (s *Service) VerifyStore(ctx context.Context, req api.StoreVerifyRequest) (*api.StoreVerified, error) {
	var ref catalog.CheckpointRef // zero: every record
	if req.Checkpoint != "" {
		var err error
		if ref, err = catalog.ParseCheckpointRef(req.Checkpoint); err != nil {
			return nil, err
		}
	}
	r, err := s.E.Verifier().VerifyStore(ctx, ref)
	if err != nil {
		return nil, err
	}
	return &api.StoreVerified{Blobs: r.Blobs, Checkpoints: len(r.Checkpoints), OK: true, Packs: r.Packs, Refs: r.Refs}, nil
}

func (s *Service) Tags(ctx context.Context) ([]api.Tag, error) {
	tags, err := s.E.History().Tags(ctx)
	if err != nil {
		return nil, err
	}
	rows := []api.Tag{}
	for _, t := range tags {
		rows = append(rows, api.Tag{Checkpoint: idOf(t.Target), Tag: t.Name})
	}
	return rows, nil
}

func (s *Service) SetTag(ctx context.Context, name string, req api.TagRequest) (*api.Tagged, error) {
	ref, err := catalog.ParseCheckpointRef(req.Checkpoint)
	if err != nil {
		return nil, err
	}
	cp, err := s.E.History().Tag(ctx, name, ref)
	if err != nil {
		return nil, err
	}
	return &api.Tagged{Checkpoint: idOf(cp.ID), Sandbox: string(cp.Sandbox), Tag: name, Turn: cp.Turn}, nil
}

func (s *Service) DeleteTag(ctx context.Context, name string) (*api.Untagged, error) {
	if err := s.E.History().Untag(ctx, name); err != nil {
		return nil, err
	}
	return &api.Untagged{Deleted: true, Tag: name}, nil
}

func (s *Service) Status(ctx context.Context) (*api.StatusReport, error) {
	return wirePtr[api.StatusReport](s.E.HomeSetup().Status(ctx))
}

// Sync returns once everything queued (for req.Sandbox, or all) is in the
// remote store.
func (s *Service) Sync(ctx context.Context, req api.SyncRequest) (*api.Synced, error) {
	r, err := s.push(ctx, req.Sandbox, false)
	if err != nil {
		return nil, err
	}
	return &api.Synced{Bytes: r.Bytes, Deleted: r.Deleted, DurationMS: ms(r.Duration), Uploaded: r.Uploaded}, nil
}

func (s *Service) Prune(ctx context.Context, req api.PruneRequest) (*api.Pruned, error) {
	grace, err := recordGrace(req.GraceMS, "prune")
	if err != nil {
		return nil, err
	}
	r, err := s.E.Retention().Prune(ctx, retention.PruneOptions{KeepLast: req.KeepLast, DryRun: req.DryRun, Grace: grace})
	if err != nil {
		return nil, err
	}
	if r.Checkpoints == nil {
		r.Checkpoints = []retention.Entry{}
	}
	out := &api.Pruned{Deleted: make([]api.ID, len(r.Deleted)), NDeleted: len(r.Deleted), Kept: r.Kept, NMarked: len(r.Marked)}
	for i, id := range r.Deleted {
		out.Deleted[i] = idOf(id)
	}
	if out.Checkpoints, err = wire[[]api.RetentionEntry](r.Checkpoints); err != nil {
		return nil, err
	}
	if out.Marked, err = wire[[]api.RetentionEntry](r.Marked); err != nil {
		return nil, err
	}
	if !req.DryRun {
		s.Monitor.changed(api.Event{Type: api.EventForget, Deleted: len(r.Deleted)})
	}
	if req.GC && !req.DryRun {
		g, err := s.E.Retention().GC(ctx, retention.GCOptions{Grace: retention.DefaultGCGrace})
		if err != nil {
			return nil, err
		}
		s.Monitor.gced(g)
		if out.GC, err = wirePtr[api.GCReport](g, nil); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (s *Service) GC(ctx context.Context, req api.GCRequest) (*api.GCReport, error) {
	grace := retention.DefaultGCGrace
	if req.GraceMS != nil {
		if *req.GraceMS < 0 {
			return nil, invalidf("gc: negative grace")
		}
		grace = time.Duration(*req.GraceMS) * time.Millisecond
	}
	r, err := s.E.Retention().GC(ctx, retention.GCOptions{Grace: grace, DryRun: req.DryRun})
	if err == nil {
		s.Monitor.gced(r)
	}
	return wirePtr[api.GCReport](r, err)
}

// Init gives the home a remote store and/or an encryption key.
func (s *Service) Init(ctx context.Context, req api.InitRequest) (*api.Initialised, error) {
	if req.Remote == nil && req.KeyFile == "" {
		return nil, invalidf("init: give --remote and --endpoint, --key-file, or both")
	}
	if req.Remote != nil && (req.Remote.URL == "") != (req.Remote.Endpoint == "") {
		return nil, invalidf("init: --remote and --endpoint go together")
	}
	var remote *engine.RemoteConfig
	if req.Remote != nil {
		rc, err := wire[engine.RemoteConfig](req.Remote)
		if err != nil {
			return nil, invalidf("init: remote: %v", err)
		}
		remote = &rc
	}
	r, err := s.E.HomeSetup().Setup(ctx, engine.SetupOptions{Remote: remote, KeyFile: req.KeyFile,
		PlainLocal: req.EncryptLocal != nil && !*req.EncryptLocal})
	if err != nil {
		return nil, err
	}
	return &api.Initialised{KeyID: s.E.Keys().KeyID(), IDs: s.E.Keys().IDs().Scheme(), EncryptLocal: s.E.Keys().KeyID() != "" && !s.E.Keys().PlainLocal(),
		Queued: r.Queued, QueuedBytes: r.QueuedBytes, Remote: r.Remote}, nil
}

func (s *Service) RebuildCatalog(ctx context.Context, req api.RebuildRequest) (*api.Rebuilt, error) {
	r, err := s.E.Rebuilder().RebuildCatalogWith(ctx, engine.RebuildOptions{SkipCorrupt: req.SkipCorrupt, Strict: req.Strict})
	if err != nil {
		return nil, err
	}
	if s.LLM != nil {
		s.LLM.restoredAll(ctx)
	}
	corrupt := make([]api.CorruptObject, len(r.Corrupt))
	for i, c := range r.Corrupt {
		corrupt[i] = api.CorruptObject{Name: c.Name, Error: c.Error}
	}
	skipped := make([]api.SkippedObject, len(r.Skipped))
	for i, o := range r.Skipped {
		skipped[i] = api.SkippedObject{Name: o.Name, Class: api.SkipClass(o.Class), Sandbox: o.Sandbox, Error: o.Error}
	}
	result := api.RebuildComplete
	if r.Partial() {
		result = api.RebuildPartial
	}
	return &api.Rebuilt{Blobs: r.Blobs, Checkpoints: r.Checkpoints, Corrupt: corrupt, DurationMS: ms(r.Duration),
		Packs: r.Packs, Refs: r.Refs, Sandboxes: r.Sandboxes, Result: result, Skipped: skipped}, nil
}
