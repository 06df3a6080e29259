package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/remote"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// The remote side of a home is package remote's Home (Engine.Remote);
// these are its types as the engine's callers name them.
type (
	PushOptions  = remote.PushOptions
	PushReport   = remote.PushReport
	LockInfo     = remote.LockInfo
	AdoptOptions = remote.AdoptOptions
	AdoptReport  = remote.AdoptReport
	LeaseView    = remote.LeaseView
	LastPush     = remote.LastPush
)

// backfillSandbox attributes uploads that belong to no sandbox in particular.
const backfillSandbox = remote.BackfillSandbox

// Remote is the remote side of this home: push, ownership and leases, the
// bucket's locks.
func (e *Engine) Remote() *remote.Home { return e.rem }

// newRemote makes the remote side of this home, reading the engine's
// stores, catalog and config as they are at each call.
func newRemote(e *Engine) *remote.Home {
	return remote.New(remote.Deps{
		Dir:     string(e.home),
		Stores:  func() (upload.Store, upload.Store) { return e.local, e.remote },
		Catalog: func() *catalog.Catalog { return e.cat },
		Blobs:   func() delta.BlobLoader { return e.repo },
		Settings: func() remote.Settings {
			s := remote.Settings{HomeID: e.config.HomeID}
			if rc := e.config.Remote; rc != nil {
				s.Concurrency, s.BandwidthBytes, s.URL = rc.Concurrency, rc.BandwidthBytes, rc.URL
				s.LockStaleAfter = time.Duration(rc.LockStaleAfterNs)
			}
			return s
		},
		Log:    e.log,
		Shared: e.shared,
		Op:     e.op,
		Rollback: func(ctx context.Context, sandbox string, id delta.ID) error {
			_, err := e.Rollback(ctx, sandbox, id.String(), RollbackOptions{})
			return err
		},
		SandboxDir: e.home.sandboxDir,
	})
}

// InitReport says what Init did.
type InitReport struct {
	Remote string
	// Queued counts local objects the remote store lacked, now queued.
	Queued      int
	QueuedBytes int64
}

// Init gives this home a remote store: it checks that the bucket is
// reachable (creating it if needed), saves the configuration, and queues
// every local object the bucket lacks, so a home with history becomes
// remotely durable at the next push. Running it again with the same remote
// is harmless; switching to another remote is refused.
func (e *Engine) Init(ctx context.Context, rc RemoteConfig) (*InitReport, error) {
	return e.Setup(ctx, SetupOptions{Remote: &rc})
}

// SetupOptions says what Setup configures; either may be left out.
type SetupOptions struct {
	Remote *RemoteConfig
	// KeyFile, if set, encrypts the store with this master key (engine/keys):
	// a new store gets a new data key; a store (local or remote) already
	// encrypted must be opened by it.
	KeyFile string
	// PlainLocal, with KeyFile, leaves the local store and catalog
	// plaintext (--encrypt-local=false): only what goes to the remote
	// store is sealed. It is chosen when the home is first encrypted.
	PlainLocal bool
}

// Setup is Init with encryption: the remote store first (so a second
// host finds the data key there), then the key, then the backfill, which
// queues what the bucket lacks through the sealing wrappers.
func (e *Engine) Setup(ctx context.Context, opts SetupOptions) (_ *InitReport, err error) {
	defer e.exclusive()()
	if opts.PlainLocal && opts.KeyFile == "" {
		return nil, fmt.Errorf("home %s: a plaintext local store is an option of encryption: give the key file too: %w", e.home, errdefs.ErrInvalid)
	}
	// A setup that fails leaves the engine on the stores it had: the remote
	// is the home's only once its queue and config are saved.
	restore := e.keys.Mark()
	defer func() {
		if err != nil {
			restore()
			e.repo = e.newRepo()
			setBackendIDs(e.backends, e.ids())
		}
	}()
	rep := &InitReport{}
	if rc := opts.Remote; rc != nil {
		if old := e.config.Remote; old != nil && (old.URL != rc.URL || old.Endpoint != rc.Endpoint) {
			return nil, fmt.Errorf("home %s already uses remote %s at %s; a home has one remote: %w",
				e.home, old.URL, old.Endpoint, errdefs.ErrPrecondition)
		}
		cfg, err := rc.s3Config()
		if err != nil {
			return nil, err
		}
		cfg.CreateBucket = true
		s3, err := upload.NewS3(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("remote %s: %w", rc.URL, err)
		}
		e.keys.SetRemote(upload.WithRetry(s3, upload.RetryPolicy{Logger: e.log}))
		rep.Remote = rc.URL
	}
	if opts.KeyFile != "" {
		if err := e.keys.SetUp(ctx, opts.KeyFile, opts.PlainLocal); err != nil {
			return nil, err
		}
	} else if err := e.keys.RefuseIfEncrypted(ctx); err != nil {
		return nil, err
	}
	if rc := opts.Remote; rc != nil {
		c := *e.config
		c.Remote = rc
		if err := saveConfig(e.home, &c); err != nil {
			return nil, err
		}
		e.config = &c
	}
	e.repo = e.newRepo()
	if rc := opts.Remote; rc != nil {
		// Queue first, configure after: a home whose config names a remote
		// must have its whole history queued, or `status` would report as
		// sent what was never queued. An init that fails midway leaves no
		// remote and a partial queue, which the next init completes.
		s := e.rem.Syncer()
		s.Remote, s.URL = e.remote, rc.URL
		var err error
		if rep.Queued, rep.QueuedBytes, err = s.Backfill(ctx, e.cat); err != nil {
			return nil, err
		}
		c := *e.config
		c.Remote = rc
		if err := saveConfig(e.home, &c); err != nil {
			return nil, err
		}
		e.config = &c
	} else if e.remote != nil {
		var err error
		if rep.Queued, rep.QueuedBytes, err = e.rem.Syncer().Backfill(ctx, e.cat); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// SandboxStatus is one sandbox's share of the upload queue.
type SandboxStatus struct {
	Sandbox        string `json:"sandbox"`
	PendingObjects int    `json:"objects_pending"`
	PendingBytes   int64  `json:"bytes_pending"`
	// StoredBytes is what the sandbox's checkpoints added to the store in
	// all, the scale against which PendingBytes is progress.
	StoredBytes int64 `json:"bytes_stored"`
	// Checkpoints not yet remotely durable (their record is queued), of
	// Checkpoints in all: the share that is durable is the upload progress
	// that matters (a checkpoint is remotely durable once its record is).
	PendingCheckpoints int `json:"checkpoints_pending"`
	Checkpoints        int `json:"checkpoints"`
	// RemoteDurable is true only when nothing the sandbox needs is still
	// queued: none of its own objects (records, description, head ref) and
	// not the record its head names, which may be another sandbox's (a
	// branch, or a rollback to another sandbox's checkpoint).
	RemoteDurable bool `json:"remote_durable"`
	// WaitsFor names the other sandboxes whose queued uploads this one's
	// head needs.
	WaitsFor []string `json:"waits_for,omitempty"`
	// Interrupted is what an interrupted operation left on the sandbox
	// (engine/intent): a pending rollback, processes not restored.
	Interrupted *Interrupted `json:"interrupted,omitempty"`
}

// StatusReport is the state of this home's remote durability.
type StatusReport struct {
	Remote       string          `json:"remote"` // "" without a remote
	QueueDepth   int             `json:"objects_pending"`
	PendingBytes int64           `json:"bytes_pending"`
	Sandboxes    []SandboxStatus `json:"sandboxes"`
	// LastPush is the most recent push's outcome; uploads run only during
	// `sync` and `checkpoint --wait-remote`, so its rate is the upload rate.
	LastPush *LastPush `json:"last_push,omitempty"`
}

// Status reports what is still waiting for the remote store, per sandbox.
// It reads only the catalog: no network.
func (e *Engine) Status(ctx context.Context) (*StatusReport, error) {
	defer e.shared()()
	rep := &StatusReport{Sandboxes: []SandboxStatus{}} // [] in JSON, never null
	if e.config.Remote != nil {
		rep.Remote = e.config.Remote.URL
	}
	rep.LastPush = e.rem.LastPush()
	err := e.view(ctx, func(tx *catalog.Tx) error {
		pending, err := tx.PendingUploads("")
		if err != nil {
			return err
		}
		by := map[string]*SandboxStatus{}
		var order []string
		get := func(name string) *SandboxStatus {
			if s, ok := by[name]; ok {
				return s
			}
			by[name] = &SandboxStatus{Sandbox: name}
			order = append(order, name)
			return by[name]
		}
		sbs, err := tx.Sandboxes()
		if err != nil {
			return err
		}
		heads := map[string]delta.ID{}
		for _, sb := range sbs {
			s := get(sb.Name)
			s.Interrupted = e.intents().Interrupted(sb)
			if h, err := tx.GetRef(delta.RefHead, sb.Name); err == nil {
				heads[sb.Name] = h
			}
			cps, err := tx.SandboxCheckpoints(sb.Name)
			if err != nil {
				return err
			}
			s.Checkpoints += len(cps)
			for _, cp := range cps {
				s.StoredBytes += cp.Stats.BytesNew
			}
		}
		queuedBy := map[string]string{} // pending object name -> sandbox that queued it
		for _, p := range pending {
			queuedBy[p.Name] = p.Sandbox
			s := get(p.Sandbox)
			s.PendingObjects++
			s.PendingBytes += p.Size
			if strings.HasPrefix(p.Name, delta.RecordPrefix) {
				s.PendingCheckpoints++
			}
			rep.QueueDepth++
			rep.PendingBytes += p.Size
		}
		for _, n := range order {
			s := by[n]
			s.RemoteDurable = rep.Remote != "" && s.PendingObjects == 0
			if h, ok := heads[n]; ok {
				if other, queued := queuedBy[delta.RecordName(h)]; queued {
					s.RemoteDurable = false
					if other != n {
						s.WaitsFor = append(s.WaitsFor, other)
					}
				}
			}
			rep.Sandboxes = append(rep.Sandboxes, *s)
		}
		return nil
	})
	return rep, err
}
