// Package setup owns a home's set-up: giving it a remote store (Init),
// encrypting it (Setup), and reporting what still waits for the remote
// store (Status). The engine builds a Home on demand; the stores, keys and
// catalog it swaps stay the engine's, reached through Deps.
package setup

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/keys"
	"github.com/turnsnap/turnsnap/engine/procs"
	"github.com/turnsnap/turnsnap/engine/remote"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// Deps is what the set-up needs from the engine. The functions read the
// engine's state as it is at each call: Setup changes it as it goes.
type Deps struct {
	Home string
	// Exclusive and Shared take the engine's maintenance lock.
	Exclusive, Shared func() (done func())
	Keys              *keys.Ring
	// Remote is the remote the home's config names (nil: none);
	// SaveRemote saves rc as the config's remote.
	Remote     func() *RemoteConfig
	SaveRemote func(rc *RemoteConfig) error
	// NewRepo remakes the engine's content repository over the stores as
	// the keys now wire them; BackendIDs gives the backends the content ID
	// scheme the keys now give.
	NewRepo, BackendIDs func()
	// RemoteStore is the engine's remote store (nil without a remote).
	RemoteStore func() upload.Store
	Catalog     func() *catalog.Catalog
	Syncer      func() *remote.Syncer
	LastPush    func() *remote.LastPush
	// Interrupted is what an interrupted operation left on a sandbox.
	Interrupted func(sb *delta.Sandbox) *procs.Interrupted
	Log         *slog.Logger
}

// Home is one home's set-up.
type Home struct{ d Deps }

// New returns the set-up of the home d describes.
func New(d Deps) *Home { return &Home{d: d} }

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
func (h *Home) Init(ctx context.Context, rc RemoteConfig) (*InitReport, error) {
	return h.Setup(ctx, SetupOptions{Remote: &rc})
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
func (h *Home) Setup(ctx context.Context, opts SetupOptions) (_ *InitReport, err error) {
	defer h.d.Exclusive()()
	if opts.PlainLocal && opts.KeyFile == "" {
		return nil, fmt.Errorf("home %s: a plaintext local store is an option of encryption: give the key file too: %w", h.d.Home, errdefs.ErrInvalid)
	}
	// A setup that fails leaves the engine on the stores it had: the remote
	// is the home's only once its queue and config are saved.
	restore := h.d.Keys.Mark()
	defer func() {
		if err != nil {
			restore()
			h.d.NewRepo()
			h.d.BackendIDs()
		}
	}()
	rep := &InitReport{}
	if rc := opts.Remote; rc != nil {
		if old := h.d.Remote(); old != nil && (old.URL != rc.URL || old.Endpoint != rc.Endpoint) {
			return nil, fmt.Errorf("home %s already uses remote %s at %s; a home has one remote: %w",
				h.d.Home, old.URL, old.Endpoint, errdefs.ErrPrecondition)
		}
		cfg, err := rc.S3Config()
		if err != nil {
			return nil, err
		}
		cfg.CreateBucket = true
		s3, err := upload.NewS3(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("remote %s: %w", rc.URL, err)
		}
		h.d.Keys.SetRemote(upload.WithRetry(s3, upload.RetryPolicy{Logger: h.d.Log}))
		rep.Remote = rc.URL
	}
	if opts.KeyFile != "" {
		if err := h.d.Keys.SetUp(ctx, opts.KeyFile, opts.PlainLocal); err != nil {
			return nil, err
		}
	} else if err := h.d.Keys.RefuseIfEncrypted(ctx); err != nil {
		return nil, err
	}
	if rc := opts.Remote; rc != nil {
		if err := h.d.SaveRemote(rc); err != nil {
			return nil, err
		}
	}
	h.d.NewRepo()
	if rc := opts.Remote; rc != nil {
		// Queue first, configure after: a home whose config names a remote
		// must have its whole history queued, or `status` would report as
		// sent what was never queued. An init that fails midway leaves no
		// remote and a partial queue, which the next init completes.
		s := h.d.Syncer()
		s.Remote, s.URL = h.d.RemoteStore(), rc.URL
		var err error
		if rep.Queued, rep.QueuedBytes, err = s.Backfill(ctx, h.d.Catalog()); err != nil {
			return nil, err
		}
		if err := h.d.SaveRemote(rc); err != nil {
			return nil, err
		}
	} else if h.d.RemoteStore() != nil {
		var err error
		if rep.Queued, rep.QueuedBytes, err = h.d.Syncer().Backfill(ctx, h.d.Catalog()); err != nil {
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
	// (intent.go): a pending rollback, processes not restored.
	Interrupted *procs.Interrupted `json:"interrupted,omitempty"`
}

// StatusReport is the state of this home's remote durability.
type StatusReport struct {
	Remote       string          `json:"remote"` // "" without a remote
	QueueDepth   int             `json:"objects_pending"`
	PendingBytes int64           `json:"bytes_pending"`
	Sandboxes    []SandboxStatus `json:"sandboxes"`
	// LastPush is the most recent push's outcome; uploads run only during
	// `sync` and `checkpoint --wait-remote`, so its rate is the upload rate.
	LastPush *remote.LastPush `json:"last_push,omitempty"`
}

// QueueTotals is Status's QueueDepth and PendingBytes alone, for the
// daemon's /metrics: it reads the upload queue and nothing else, so a
// scrape costs what is queued, not the home's history (Status reads every
// checkpoint of every sandbox: 116 ms a scrape at 1,000 checkpoints in
// BenchmarkScaleHistory, growing with the history).
func (h *Home) QueueTotals(ctx context.Context) (objects int, bytes int64, err error) {
	defer h.d.Shared()()
	err = h.d.Catalog().View(ctx, func(tx *catalog.Tx) error {
		pending, err := tx.PendingUploads("")
		for _, p := range pending {
			objects++
			bytes += p.Size
		}
		return err
	})
	return objects, bytes, err
}

// Status reports what is still waiting for the remote store, per sandbox.
// It reads only the catalog: no network.
func (h *Home) Status(ctx context.Context) (*StatusReport, error) {
	defer h.d.Shared()()
	rep := &StatusReport{Sandboxes: []SandboxStatus{}} // [] in JSON, never null
	if rc := h.d.Remote(); rc != nil {
		rep.Remote = rc.URL
	}
	rep.LastPush = h.d.LastPush()
	err := h.d.Catalog().View(ctx, func(tx *catalog.Tx) error {
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
			s := get(string(sb.Name))
			s.Interrupted = h.d.Interrupted(sb)
			if h, err := tx.GetRef(delta.RefHead, string(sb.Name)); err == nil {
				heads[string(sb.Name)] = h
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
