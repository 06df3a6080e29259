package engine

import (
	"context"

	"github.com/turnsnap/turnsnap/engine/retention"
)

// Retention is the home's retention: prune, forget, stored policies and gc
// (package retention). Each of its operations takes the engine's
// exclusive lock (ShowPolicies the shared one).
func (e *Engine) Retention() *retention.Retention { return e.retention }

// newRetention wires retention to this engine. Parts are read at each
// operation: setup, key changes and rebuilds replace the stores and the
// catalog under the exclusive lock.
func (e *Engine) newRetention() *retention.Retention {
	return retention.New(retention.Deps{
		Home: string(e.home),
		Log:  e.log,
		Parts: func() retention.Parts {
			return retention.Parts{HomeID: e.config.HomeID, Catalog: e.cat, Store: e.store,
				Local: e.local, Remote: e.remote, Blobs: e.repo}
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
		ReadPackHeader: e.readPackHeader,
		LoaderFor:      e.loaderFor,
		ProgressPhase:  e.progressPhase,
		Phase:          e.phase,
	})
}
