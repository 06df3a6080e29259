package server

import (
	"context"
	"fmt"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/btrfs"
	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload/sched"
)

// Service is the API over one open engine, in wire types: the HTTP handler
// serves its methods, and the CLI calls the same methods directly when no
// daemon serves the home, so both print the same objects.
type Service struct {
	E *engine.Engine
	// Uploads, if set, does the pushes that sync and wait_remote ask for
	// (the daemon's background pusher); nil: the service pushes itself.
	Uploads Uploader
	// Monitor, if set, hears every turn and restore (events, metrics).
	Monitor *Monitor
	// PushProgress, if set, sees the scheduler's counters during a push the
	// service runs itself.
	PushProgress func(sched.Stats)
	// BeforeExec, if set, runs once a command's container is ready, just
	// before the command starts (the CLI frees the home there).
	BeforeExec func() error
	// LLM, if set, is the daemon's LLM proxy (llm.go): restores reset its
	// journals.
	LLM *LLM
}

// Uploader is what the service needs of a background pusher.
type Uploader interface {
	// Committed says a checkpoint's objects were queued.
	Committed(sandbox string, id delta.ID)
	// Wait returns once everything queued for sandbox ("" every sandbox)
	// before the call is in the remote store.
	Wait(ctx context.Context, sandbox string) (*engine.PushReport, error)
}

func backendConfig(backend, pool string) (string, btrfs.Options, error) {
	if backend == "" && pool != "" {
		backend = btrfs.Name
	}
	switch {
	case backend == btrfs.Name && pool == "":
		return "", btrfs.Options{}, invalidf("backend btrfs needs a btrfs pool (--btrfs-pool PATH)")
	case backend == btrfs.Name:
		return backend, btrfs.Options{Pool: pool}, nil
	case pool != "":
		return "", btrfs.Options{}, invalidf("a btrfs pool is for the btrfs backend, not %q", backend)
	}
	return backend, btrfs.Options{}, nil
}

func (s *Service) CreateSandbox(ctx context.Context, req api.CreateRequest) (*api.Created, error) {
	backend, cfg, err := backendConfig(req.Backend, req.BtrfsPool)
	if err != nil {
		return nil, err
	}
	name, err := delta.ParseSandboxName(req.Name)
	if err != nil {
		return nil, err
	}
	if req.Base == "" {
		return nil, invalidf("sandbox %s: no base directory given", name)
	}
	r, err := s.E.CreateSandbox(ctx, name, engine.CreateOptions{Base: req.Base, Backend: backend, Btrfs: cfg})
	if err != nil {
		return nil, err
	}
	s.Monitor.changed(api.Event{Type: api.EventCreated, Sandbox: string(r.Sandbox.Name), Checkpoint: r.Checkpoint.ID.String(), DurationMS: ms(r.Duration)})
	return &api.Created{Backend: r.Sandbox.Backend, BaseBytesRead: r.BaseStats.BytesRead, BaseFiles: r.BaseStats.Entries,
		BaseTree: idOf(r.Sandbox.BaseTree), BytesNew: r.Checkpoint.Stats.BytesNew, Checkpoint: idOf(r.Checkpoint.ID),
		DurationMS: ms(r.Duration), Name: string(r.Sandbox.Name), Root: r.Root}, nil
}

func (s *Service) ListSandboxes(ctx context.Context) ([]api.Sandbox, error) {
	sbs, err := s.E.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	rows := []api.Sandbox{}
	for _, sb := range sbs {
		row := sandboxOf(sb)
		row.Lazy = lazyOf(s.E.Lazy().Status(sb.Sandbox.Name))
		rows = append(rows, row)
	}
	return rows, nil
}

func (s *Service) GetSandbox(ctx context.Context, name string) (*api.Sandbox, error) {
	rows, err := s.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range rows {
		if r.Name == name {
			return &r, nil
		}
	}
	return nil, fmt.Errorf("sandbox %s: %w", name, errdefs.ErrNotFound)
}

func (s *Service) SandboxPath(ctx context.Context, name string) (*api.SandboxPath, error) {
	sb, err := delta.ParseSandboxName(name)
	if err != nil {
		return nil, err
	}
	p, err := s.E.SandboxPath(ctx, sb)
	if err != nil {
		return nil, err
	}
	return &api.SandboxPath{Name: name, Root: p}, nil
}

func (s *Service) RemoveSandbox(ctx context.Context, name string, catalogOnly bool) (*api.Removed, error) {
	sb, err := delta.ParseSandboxName(name)
	if err != nil {
		return nil, err
	}
	if err := s.E.RemoveSandboxWith(ctx, sb, engine.RemoveOptions{CatalogOnly: catalogOnly}); err != nil {
		return nil, err
	}
	s.Monitor.changed(api.Event{Type: api.EventRemoved, Sandbox: name})
	s.llmRemoved(ctx, name)
	return &api.Removed{Name: name, Removed: true}, nil
}

func (s *Service) AdoptSandbox(ctx context.Context, name string, req api.AdoptRequest) (*api.Adopted, error) {
	sb, err := delta.ParseSandboxName(name)
	if err != nil {
		return nil, err
	}
	r, err := s.E.Remote().Adopt(ctx, sb, engine.AdoptOptions{Force: req.Force})
	if err != nil {
		return nil, err
	}
	return &api.Adopted{Name: r.Sandbox, SandboxID: r.Key, Head: r.Head.String(), FromHome: r.From.Home, FromEpoch: r.From.Epoch,
		Home: r.Owner.Home, Epoch: r.Owner.Epoch, Already: r.Already, OwnerLeaseLive: r.Lease != nil && r.Lease.Live}, nil
}

func (s *Service) ResumeSandbox(ctx context.Context, name string) (*api.Resumed, error) {
	sb, err := delta.ParseSandboxName(name)
	if err != nil {
		return nil, err
	}
	r, err := s.E.Processes().Resume(ctx, sb)
	if err != nil {
		return nil, err
	}
	return &api.Resumed{FrozenBy: r.FrozenBy, Name: r.Sandbox, WasFrozen: r.WasFrozen}, nil
}

// Exec runs a command in the sandbox with the given streams. For a
// detached command it returns at once with the pid.
func (s *Service) Exec(ctx context.Context, name string, req api.ExecRequest, stdio api.Stdio) (*api.Exited, error) {
	sb, err := delta.ParseSandboxName(name)
	if err != nil {
		return nil, err
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, invalidf("sandbox %s: exec needs a command", name)
	}
	if req.Log != "" && !req.Detach {
		return nil, invalidf("sandbox %s: a log file is for a detached command", name)
	}
	run, err := s.E.Processes().PrepareExec(ctx, sb)
	if err != nil {
		return nil, err
	}
	s.LLM.routeAgent(ctx, sb) // the container runs: the agent's way to the proxy
	if s.BeforeExec != nil {
		if err := s.BeforeExec(); err != nil {
			return nil, err
		}
	}
	code, err := run(ctx, req.Argv, engine.ExecOptions{Detach: req.Detach, Log: req.Log,
		Stdin: stdio.In, Stdout: stdio.Out, Stderr: stdio.Err})
	if err != nil {
		return nil, err
	}
	if req.Detach {
		return &api.Exited{Argv: req.Argv, Log: req.Log, PID: code, Sandbox: name}, nil
	}
	return &api.Exited{ExitCode: code, Sandbox: name}, nil
}

// Checkpoint closes a turn; with WaitRemote it returns once the
// checkpoint is in the bucket.
func (s *Service) Checkpoint(ctx context.Context, name string, req api.CheckpointRequest) (*api.Checkpoint, error) {
	sb, err := delta.ParseSandboxName(name)
	if err != nil {
		return nil, err
	}
	s.Monitor.started(name)
	start := time.Now()
	r, err := s.E.Checkpoint(ctx, sb, engine.CheckpointOptions{Turn: req.Turn, Message: req.Message, RecordSkips: req.RecordSkips})
	s.Monitor.checkpointed(name, r, err, time.Since(start))
	if err != nil {
		return nil, err
	}
	if r.Class != delta.ClassSkip && s.Uploads != nil {
		s.Uploads.Committed(name, r.ID)
	}
	out := checkpointOf(r)
	if req.WaitRemote {
		if _, err := s.push(ctx, name, true); err != nil {
			return nil, fmt.Errorf("checkpoint %s is durable locally, not yet remotely: %w", r.ID.Short(), err)
		}
		// A round that ran before this one (the background pusher's) may
		// have been refused this sandbox's head: the checkpoint is then
		// fenced, and never remotely durable, though this round sent
		// nothing and failed nothing.
		fenced, err := s.E.Remote().Fenced(ctx, r.ID)
		if err != nil {
			return nil, err
		}
		if fenced {
			return nil, fmt.Errorf("checkpoint %s is durable locally, not remotely: the bucket refused sandbox %s's head (another home adopted it; `turnsnap branch %s NEW-NAME` keeps this turn): %w",
				r.ID.Short(), name, r.ID.Short(), errdefs.ErrPrecondition)
		}
		out.RemoteDurable = true
	}
	return out, nil
}

// push uploads what sandbox ("" all) queued: through the background
// pusher when there is one (never cancelling its push in flight),
// otherwise here.
func (s *Service) push(ctx context.Context, sandbox string, urgent bool) (*engine.PushReport, error) {
	if s.Uploads != nil {
		return s.Uploads.Wait(ctx, sandbox)
	}
	return s.E.Remote().Push(ctx, engine.PushOptions{Sandbox: sandbox, Urgent: urgent, Progress: s.PushProgress})
}

func (s *Service) Log(ctx context.Context, name string) ([]api.LogEntry, error) {
	sb, err := delta.ParseSandboxName(name)
	if err != nil {
		return nil, err
	}
	entries, err := s.E.History().Log(ctx, sb)
	if err != nil {
		return nil, err
	}
	rows := []api.LogEntry{}
	for _, l := range entries {
		e := logEntryOf(l.Checkpoint, l.Head, l.OnHead)
		if len(l.Branches) > 0 {
			e.Branches = l.Branches
		}
		rows = append(rows, e)
	}
	return rows, nil
}

// GetCheckpoint is one checkpoint by reference (id, prefix, tag).
func (s *Service) GetCheckpoint(ctx context.Context, ref string) (*api.LogEntry, error) {
	r, err := catalog.ParseCheckpointRef(ref)
	if err != nil {
		return nil, err
	}
	cp, err := s.E.Resolve(ctx, r)
	if err != nil {
		return nil, err
	}
	if entries, err := s.E.History().Log(ctx, cp.Sandbox); err == nil {
		for _, l := range entries {
			if l.ID == cp.ID {
				e := logEntryOf(l.Checkpoint, l.Head, l.OnHead)
				return &e, nil
			}
		}
	}
	e := logEntryOf(cp, false, false)
	return &e, nil
}

func (s *Service) Diff(ctx context.Context, name, from, to string) (*api.Diff, error) {
	if from == "" && to != "" {
		return nil, invalidf("diff of sandbox %s: a 'to' needs a 'from'", name)
	}
	sb, err := delta.ParseSandboxName(name)
	if err != nil {
		return nil, err
	}
	fromRef, toRef, err := diffRefs(from, to)
	if err != nil {
		return nil, err
	}
	r, err := s.E.History().Diff(ctx, sb, fromRef, toRef)
	if err != nil {
		return nil, err
	}
	out := &api.Diff{Changes: []api.Change{}, From: r.From, Sandbox: r.Sandbox, To: r.To}
	for _, c := range r.Changes {
		out.Changes = append(out.Changes, api.Change{Change: c.Kind.String(), Path: "/" + c.Path, Type: c.Type.String()})
	}
	return out, nil
}

func (s *Service) Rollback(ctx context.Context, name string, req api.RollbackRequest) (*api.Restore, error) {
	sb, err := delta.ParseSandboxName(name)
	if err != nil {
		return nil, err
	}
	if req.Abandon {
		if req.Checkpoint != "" || req.FSOnly {
			return nil, invalidf("rollback of sandbox %s: abandon takes no checkpoint and no fs_only", name)
		}
		r, err := s.E.AbandonRollback(ctx, sb)
		if err != nil {
			return nil, err
		}
		return restoreOf(r), nil
	}
	if req.Checkpoint == "" {
		return nil, invalidf("rollback of sandbox %s: no checkpoint given", name)
	}
	ref, err := catalog.ParseCheckpointRef(req.Checkpoint)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	r, err := s.E.Rollback(ctx, sb, ref, engine.RollbackOptions{FSOnly: req.FSOnly})
	s.Monitor.restored(api.EventRollback, name, r, err, time.Since(start))
	if err != nil {
		return nil, err
	}
	s.llmRestored(ctx, sb)
	return restoreOf(r), nil
}

// Branch makes one new sandbox from a checkpoint, or several (Names, or
// Count of them: NAME-1 ... NAME-COUNT) through engine.BranchMany.
func (s *Service) Branch(ctx context.Context, ref string, req api.BranchRequest) ([]api.Restore, error) {
	cpRef, err := catalog.ParseCheckpointRef(ref)
	if err != nil {
		return nil, err
	}
	backend, cfg, err := s.branchBackend(req)
	if err != nil {
		return nil, err
	}
	names := append([]string{req.Name}, req.Names...)
	if req.Count < 0 || req.Count > api.MaxBranchCount {
		return nil, invalidf("branch of %s: count %d is not between 1 and %d", ref, req.Count, api.MaxBranchCount)
	}
	if req.Count > 0 {
		if len(req.Names) > 0 {
			return nil, invalidf("branch of %s: count takes one name prefix, got %d names", ref, len(names))
		}
		if names, err = engine.BranchNames(req.Name, req.Count); err != nil {
			return nil, err
		}
	}
	sbs := make([]delta.SandboxName, len(names))
	for i, n := range names {
		if sbs[i], err = delta.ParseSandboxName(n); err != nil {
			return nil, err
		}
	}
	o := engine.BranchOptions{Backend: backend, Btrfs: cfg, FSOnly: req.FSOnly, Materialise: req.Materialise}
	start := time.Now()
	if req.Lazy && len(names) != 1 {
		return nil, invalidf("branch of %s: a lazy branch makes one sandbox, not %d", ref, len(names))
	}
	if len(names) == 1 {
		branch := s.E.Branch
		if req.Lazy {
			branch = s.E.BranchLazy
		}
		r, err := branch(ctx, cpRef, sbs[0], o)
		s.Monitor.restored(api.EventBranch, names[0], r, err, time.Since(start))
		if err != nil {
			return nil, err
		}
		s.llmRestored(ctx, sbs[0])
		return []api.Restore{*restoreOf(r)}, nil
	}
	// Several: the checkpoint is checked once and all are recorded in one
	// transaction, all or none.
	rs, err := s.E.BranchMany(ctx, cpRef, sbs, o)
	out := []api.Restore{}
	for i, r := range rs {
		var rerr error
		if r.Receipt != nil && !r.Receipt.OK {
			rerr = &engine.RestoreIncompleteError{Receipt: r.Receipt, State: "see the branch's error"}
		}
		s.Monitor.restored(api.EventBranch, r.Sandbox, r, rerr, time.Since(start))
		s.llmRestored(ctx, sbs[i]) // rs is in the order of sbs
		out = append(out, *restoreOf(r))
	}
	if err != nil && len(rs) == 0 {
		s.Monitor.restored(api.EventBranch, req.Name, nil, err, time.Since(start))
	}
	if err != nil {
		if len(out) > 0 {
			return out, fmt.Errorf("after %d of %d branches: %w", len(out), len(names), err)
		}
		return nil, err
	}
	return out, nil
}

func (s *Service) branchBackend(req api.BranchRequest) (string, btrfs.Options, error) {
	if req.Backend == "" && req.BtrfsPool == "" {
		return "", btrfs.Options{}, nil
	}
	return backendConfig(req.Backend, req.BtrfsPool)
}

// diffRefs parses a diff's from and to: an empty one is the zero
// reference (the head, the live root: history.Views.Diff).
func diffRefs(from, to string) (catalog.CheckpointRef, catalog.CheckpointRef, error) {
	var refs [2]catalog.CheckpointRef
	for i, s := range []string{from, to} {
		if s == "" {
			continue
		}
		r, err := catalog.ParseCheckpointRef(s)
		if err != nil {
			return refs[0], refs[1], err
		}
		refs[i] = r
	}
	return refs[0], refs[1], nil
}
