package engine

import (
	"context"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/rebuild"
	"github.com/turnsnap/turnsnap/engine/retention"
)

// Retention is the home's retention: prune, forget, stored policies and gc
// (package retention). Each of its operations takes the engine's
// exclusive lock (ShowPolicies the shared one).

// Retention is prune, forget, policies and gc, wired to this engine. Parts are read at each
// operation: setup, key changes and rebuilds replace the stores and the
// catalog under the exclusive lock.
func (e *Engine) Retention() *retention.Retention {
	return retention.New(retention.Deps{
		Home: string(e.home),
		Log:  e.log,
		Parts: func() retention.Parts {
			return retention.Parts{HomeID: e.config.HomeID, Catalog: e.cat, Store: e.stores.front,
				Local: e.stores.local, Remote: e.stores.remote, Blobs: e.data.repo}
		},
		Exclusive:   e.exclusive,
		Shared:      e.shared,
		LoadHistory: func(ctx context.Context) (*retention.History, error) { return e.History().LoadHistory(ctx) },
		DropFrozen:  e.dropFrozen,
		LockBucket: func(ctx context.Context, name string) (retention.BucketLock, error) {
			l, err := e.rem.Syncer().Lock(ctx, name)
			if err != nil {
				return nil, err // no typed nil in the interface
			}
			return l, nil
		},
		// A pack's header from the local copy, or straight from the remote
		// store (a range read, not a download of the whole pack).
		ReadPackHeader: func(ctx context.Context, name string) ([]delta.PackEntry, error) {
			return rebuild.ReadPackHeader(ctx, e.keys.LocalKeys(), e.stores.local, e.stores.remote, name)
		},
		// Blobs read through a location map instead of the catalog.
		LoaderFor: func(locs map[delta.ID]catalog.BlobLocation) delta.BlobLoader {
			return e.data.repo.LoaderFor(locs)
		},
		ProgressPhase: e.progressPhase,
		Phase:         e.phase,
	})
}
