// Package engine composes turnsnap's parts into turns: classify what changed
// since a sandbox's last checkpoint, commit checkpoints in the write order
// of docs/FORMAT.md (objects, then the record, then the catalog), and restore,
// branch, diff, verify and rebuild. The CLI is a thin shell over Engine.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/admission"
	"github.com/turnsnap/turnsnap/engine/content"
	"github.com/turnsnap/turnsnap/engine/keys"
	"github.com/turnsnap/turnsnap/engine/lazyrun"
	"github.com/turnsnap/turnsnap/engine/procs"
	"github.com/turnsnap/turnsnap/engine/rebuild"
	"github.com/turnsnap/turnsnap/engine/receipt"
	"github.com/turnsnap/turnsnap/engine/remote"
	"github.com/turnsnap/turnsnap/engine/room"
	"github.com/turnsnap/turnsnap/engine/statememo"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"github.com/turnsnap/turnsnap/upload"
)

// Progress is a snapshot of a long operation's work so far (content.Progress).
type Progress = content.Progress

// Options configures Open.
type Options struct {
	// Home is the directory holding everything turnsnap keeps on this host.
	Home string
	// LockWait is how long to wait for another turnsnap process using Home.
	// Zero fails at once.
	LockWait time.Duration
	Logger   *slog.Logger
	// Progress, if set, is called from time to time during long operations
	// with the work done so far.
	Progress func(Progress)
	// AtPhase, if set, is called as a checkpoint reaches each phase
	// (PhaseFreeze ... PhaseCommit): tests stop turnsnap there to kill it
	// at a known point.
	AtPhase func(phase string)
	// ReadOnly opens the home for commands that only read (log, status,
	// sandbox list, verify): nothing in the home is written, so they work on
	// a full or read-only filesystem. Anything that writes fails.
	ReadOnly bool
	// TrackChanges keeps a change tracker (fanotify) on every overlay
	// sandbox this engine checkpoints, so a turn reads only what changed
	// and an unchanged turn reads nothing (docs/TRACKING.md). For a
	// long-lived engine (the daemon): a tracker's first turn walks.
	TrackChanges bool
	// FreezeOnBranch makes an overlay checkpoint's frozen layer
	// (docs/ARCHITECTURE.md, "Frozen layers") after the checkpoint only
	// when it can be made from a layer this host keeps (the sandbox was
	// branched, or is a branch), and otherwise when a branch of the
	// checkpoint asks for it. The CLI's direct mode sets it: its process
	// waits for its background work before it exits, and most sandboxes
	// are never branched (a 2,000-file layer's first checkpoint took 0.82 s
	// with its freeze, 0.19 s without).
	FreezeOnBranch bool
	// MaxCheckpoints is how many checkpoints run their heavy phases (scan,
	// store, commit) at once; the others queue, urgent ones first
	// (engine/admission). 0 means GOMAXPROCS; negative, no limit.
	MaxCheckpoints int
}

// DefaultLockWait lets short commands queue behind each other (a checkpoint
// of a large change can take seconds) without hanging a script forever.
const DefaultLockWait = 30 * time.Second

// Engine is one open turnsnap home. It holds the home's lock until Close.
type Engine struct {
	home home
	lock *homeLock
	// opts are the options it was opened with (AtPhase, ReadOnly: an
	// engine that reports interrupted work and does not finish it).
	opts   Options
	config *Config
	log    *slog.Logger
	// stores are the object stores; keys owns the home's encryption: its
	// data key and the raw stores beneath the sealing wrappers.
	stores tiers
	keys   *keys.Ring
	cat    *catalog.Catalog
	data   contentParts
	// backends by name; the engine composes them, each owns its roots.
	backends map[string]rootfs.Backend
	procs    *procs.Manager // the sandboxes' containers (procs.go)
	rem      *remote.Home   // the remote side: push, ownership (Remote)
	receipts *receipt.Checker
	locks    engineLocks // the engine's locks and its admission (locks.go)
	memo     turnMemos
	lazy     *lazyrun.Runner // lazy restores in progress (lazy.go)
}

// tiers are the engine's object stores. front is where it reads and
// writes objects: the local store, or with a remote configured, the local
// store in front of the remote one (writes stay local until pushed; reads
// fetch what is missing). local and remote are front's tiers, beneath it:
// the sealing wrappers the keys put over the raw stores (engine/keys).
type tiers struct {
	front, local upload.Store
	remote       upload.Store // nil without a remote
}

// contentParts read and write the content of the stores.
type contentParts struct {
	codec *delta.Codec
	repo  *content.Repo
	meter *content.Meter // nil: no progress reporting
}

// engineLocks are the engine's locks (locks.go) and its checkpoint
// admission, which bounds how many checkpoints run at once.
type engineLocks struct {
	maint     sync.RWMutex
	sandboxes sandboxLocks
	base      sync.Mutex
	commit    sync.Mutex
	// commits shares one catalog transaction between concurrent commits
	// (catalog.Group), run under commit and the index lock (commitLock).
	commits catalog.Group
	admit   *admission.Scheduler
}

// turnMemos are what turns remember to skip work: states that passed
// CheckState, rollbacks' reads (engine/statememo), and each sandbox's last
// turn's trees (headtrees.go).
type turnMemos struct {
	checked   statememo.Memo
	headTrees headTrees
}

// Open locks and opens the home, creating it on first use.
func Open(ctx context.Context, opts Options) (*Engine, error) {
	if opts.Home == "" {
		return nil, errors.New("engine: no home directory given")
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	h := home(opts.Home)
	if _, err := os.Stat(filepath.Join(h.catalogDir(), "MANIFEST")); err != nil {
		opts.ReadOnly = false // a new home: reading it means creating it
	}
	lock, err := lockHome(ctx, h, opts.LockWait, opts.ReadOnly)
	if err != nil {
		return nil, err
	}
	e := &Engine{home: h, lock: lock, log: log, opts: opts}
	e.locks.admit = admission.New(opts.MaxCheckpoints)
	e.procs = newProcs(e, h)
	e.receipts = newReceipts(e, receipt.Options{})
	e.rem = newRemote(e)
	// The repository and the IDs are read at each restore: both are
	// replaced over the engine's life (remote set-up, catalog rebuild,
	// encrypted init).
	e.lazy = lazyrun.New(lazyrun.Config{Log: log, ReadOnly: opts.ReadOnly,
		Loader: func() delta.BlobLoader { return e.data.repo },
		IDs:    func() delta.IDs { return e.keys.IDs() }})
	e.locks.commits.Hold = &commitLock{e: e}
	e.locks.commits.Shared = func(int) { e.phase(PhaseCommitGroup) }
	ok := false
	defer func() {
		if !ok {
			e.Close()
		}
	}()
	rawLocal, err := upload.NewLocal(h.storeDir())
	if err != nil {
		return nil, fmt.Errorf("home %s: store: %w", h, err)
	}
	if e.config, err = loadConfig(h); err != nil {
		return nil, err
	}
	if e.config.HomeID == "" {
		c := *e.config
		c.HomeID = delta.NewSandboxID()
		if err := saveConfig(h, &c); err != nil {
			// A read-only home creates no sandboxes, so an id that does not
			// survive this process owns nothing.
			log.Warn("home id not saved", "home", h, "err", err)
		}
		e.config = &c
	}
	var rawRemote upload.Store
	if rc := e.config.Remote; rc != nil {
		rawRemote = remote.Lazy(func(ctx context.Context) (upload.Store, error) {
			cfg, err := rc.S3Config()
			if err != nil {
				return nil, err
			}
			s, err := upload.NewS3(ctx, cfg)
			if err != nil {
				return nil, fmt.Errorf("remote %s: %w", rc.URL, err)
			}
			return upload.WithRetry(s, upload.RetryPolicy{Logger: log}), nil
		})
	}
	e.keys = keys.New(keys.Deps{Home: string(h), Local: rawLocal, Remote: rawRemote, Config: e.config.Encryption,
		Save: func(ec *keys.Config) error {
			c := *e.config
			c.Encryption = ec
			if err := saveConfig(h, &c); err != nil {
				return err
			}
			e.config = &c
			return nil
		},
		Wired: func(local, remote, store upload.Store) {
			e.stores.local, e.stores.remote, e.stores.front = local, remote, store
		},
		Renew: func(ctx context.Context) error {
			// The catalog of an empty home holds nothing the store does
			// not; it is made again, encrypted.
			if err := e.cat.Close(); err != nil {
				return err
			}
			e.cat = nil
			if err := os.RemoveAll(h.catalogDir()); err != nil {
				return err
			}
			setBackendIDs(e.backends, e.keys.IDs())
			var err error
			e.cat, err = catalog.Open(ctx, h.catalogDir(), catalogOptions(log, e.keys, false))
			return err
		},
		Exclusive: e.exclusive,
	})
	if err := e.keys.Load(ctx); err != nil {
		return nil, err
	}
	if !opts.ReadOnly {
		// Before Badger writes anything: on a full filesystem its mmapped
		// writes would kill the process instead of failing.
		if err := room.Check(string(h), e.cat, 0, 0); err != nil {
			return nil, err
		}
		if err := rebuild.Finish(h.catalogDir()); err != nil {
			return nil, err
		}
	}
	if e.cat, err = catalog.Open(ctx, h.catalogDir(), catalogOptions(log, e.keys, opts.ReadOnly)); err != nil {
		return nil, err
	}
	if e.data.codec, err = delta.NewCodec(); err != nil {
		return nil, err
	}
	if opts.Progress != nil {
		e.data.meter = content.NewMeter(opts.Progress)
	}
	e.data.repo = newRepo(e)
	e.data.repo.SetRoomCheck(func(need, held uint64) error { return room.Check(string(h), e.cat, need, held) })
	e.backends = newBackends(e, opts) // backends.go
	e.procs.CleanWork()               // process images a killed turnsnap left (engine/procs)
	ok = true
	return e, nil
}

// Close stops the backends' background work (cancelling the background
// freezes and waiting for them: a layer half built is never published),
// then releases the catalog and the home lock.
func (e *Engine) Close() error {
	e.lazy.StopAll()
	closeBackends(e.backends)
	var err error
	if e.cat != nil {
		err = e.cat.Close()
		e.cat = nil
	}
	if e.data.codec != nil {
		e.data.codec.Close()
		e.data.codec = nil
	}
	if e.lock != nil {
		e.lock.release()
		e.lock = nil
	}
	return err
}

// Home returns the home directory.
func (e *Engine) Home() string { return string(e.home) }

// HomeID returns this home's id among the homes sharing a bucket (its
// config's home_id): the identity a node agent registers under.
func (e *Engine) HomeID() string { return e.config.HomeID }

// Store returns the object store, for tools and tests that inspect it.
func (e *Engine) Store() upload.Store { return e.stores.front }

// Keys returns the home's keys: its encryption, key rotation, and the
// content ID scheme.
func (e *Engine) Keys() *keys.Ring { return e.keys }

// newRepo returns the content repository over the engine's stores and
// catalog as they are now.
func newRepo(e *Engine) *content.Repo {
	return content.NewSealedIDs(e.stores.front, e.cat, e.data.codec, e.data.meter, e.keys.LocalKeys(), e.keys.IDs())
}

// catalogOptions opens the catalog sealed with the local keys.
func catalogOptions(log *slog.Logger, k *keys.Ring, readOnly bool) catalog.Options {
	return catalog.Options{Logger: log, EncryptionKey: k.LocalKeys().CatalogKey(), ReadOnly: readOnly}
}

// Admission returns the checkpoint admission scheduler: its Stats are
// served as metrics, and background work (the daemon's pusher) yields to
// urgent checkpoints through it.
func (e *Engine) Admission() *admission.Scheduler { return e.locks.admit }

func (e *Engine) view(ctx context.Context, fn func(tx *catalog.Tx) error) error {
	return e.cat.View(ctx, fn)
}

// ensureDir makes a directory and its parents with private permissions.
func ensureDir(p string) error { return os.MkdirAll(p, 0o700) }
