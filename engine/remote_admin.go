package engine

import (
	"context"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/remote"
	"github.com/turnsnap/turnsnap/engine/setup"
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

// Remote is the remote side of this home: push, ownership and leases, the
// bucket's locks.
func (e *Engine) Remote() *remote.Home { return e.rem }

// newRemote makes the remote side of this home, reading the engine's
// stores, catalog and config as they are at each call.
func newRemote(e *Engine) *remote.Home {
	return remote.New(remote.Deps{
		Dir:     string(e.home),
		Stores:  func() (upload.Store, upload.Store) { return e.stores.local, e.stores.remote },
		Catalog: func() *catalog.Catalog { return e.cat },
		Blobs:   func() delta.BlobLoader { return e.data.repo },
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
			_, err := e.Rollback(ctx, delta.SandboxName(sandbox), catalog.IDRef(id), RollbackOptions{})
			return err
		},
	})
}

// The set-up of a home is package setup's Home (Engine.HomeSetup); these
// are its types as the engine's callers name them.
type (
	InitReport    = setup.InitReport
	SetupOptions  = setup.SetupOptions
	SandboxStatus = setup.SandboxStatus
	StatusReport  = setup.StatusReport
)

// HomeSetup is this home's set-up: its remote store (Init), its
// encryption (Setup), and what still waits for the remote store (Status).
func (e *Engine) HomeSetup() *setup.Home {
	return setup.New(setup.Deps{
		Home:      string(e.home),
		Exclusive: e.exclusive,
		Shared:    e.shared,
		Keys:      e.keys,
		Remote:    func() *RemoteConfig { return e.config.Remote },
		SaveRemote: func(rc *RemoteConfig) error {
			c := *e.config
			c.Remote = rc
			if err := saveConfig(e.home, &c); err != nil {
				return err
			}
			e.config = &c
			return nil
		},
		NewRepo:     func() { e.data.repo = newRepo(e) },
		BackendIDs:  func() { setBackendIDs(e.backends, e.keys.IDs()) },
		RemoteStore: func() upload.Store { return e.stores.remote },
		Catalog:     func() *catalog.Catalog { return e.cat },
		Syncer:      e.rem.Syncer,
		LastPush:    e.rem.LastPush,
		Interrupted: func(sb *delta.Sandbox) *Interrupted { return e.intents().Interrupted(sb) },
		Log:         e.log,
	})
}
