package engine

import (
	"context"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/history"
	"github.com/turnsnap/turnsnap/engine/paths"
	"github.com/turnsnap/turnsnap/engine/statememo"
)

// History returns the views of the home's history: log, audit, diff,
// lineage, tags (engine/history). It is made for each call; its parts are
// read at each operation, under the engine's locks, since setup, key
// changes and rebuilds replace them.
func (e *Engine) History() *history.Views {
	return history.New(history.Deps{
		HomeID: func() string { return e.config.HomeID },
		View:   e.view,
		Update: func(ctx context.Context, fn func(tx *catalog.Tx) error) error { return e.cat.Update(ctx, fn) },
		Blobs:  func() delta.BlobLoader { return e.data.repo },
		PutRef: func(ctx context.Context, kind delta.RefKind, name string, id delta.ID) error {
			return putRefObject(ctx, e.stores.front, kind, name, id)
		},
		DeleteLocal: func(ctx context.Context, name string) error {
			return e.stores.local.Delete(ctx, name)
		},
		Queue:   e.rem,
		Shared:  e.shared,
		Op:      e.op,
		Resolve: e.resolveFor,
		ViewSandbox: func(ctx context.Context, name string) (*history.Sandbox, error) {
			st, err := e.viewSandbox(ctx, delta.SandboxName(name)) // reads only: finishes nobody's work
			if err != nil {
				return nil, err
			}
			return &history.Sandbox{Head: st.head, Root: st.root, Interrupted: st.interrupted}, nil
		},
		TreeMemo: func(next delta.BlobLoader) history.TreeStore {
			return statememo.NewTrees(next)
		},
	})
}

// Paths returns the single-path operations: cat, ls, and restoring paths
// into a live sandbox under its lock (engine/paths). Made for each call,
// as History.
func (e *Engine) Paths() *paths.Ops {
	return paths.New(paths.Deps{
		Log:     e.log,
		View:    e.view,
		Blobs:   func() delta.BlobLoader { return e.data.repo },
		IDs:     func() delta.IDs { return e.keys.IDs() },
		Shared:  e.shared,
		Op:      e.op,
		Resolve: e.resolveFor,
		LiveRoot: func(ctx context.Context, name string) (string, error) {
			st, err := e.loadSandbox(ctx, delta.SandboxName(name))
			if err != nil {
				return "", err
			}
			if err := st.root.Mount(ctx); err != nil {
				return "", err
			}
			return st.root.Path(), nil
		},
	})
}
