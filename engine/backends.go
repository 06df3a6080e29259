package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/turnsnap/turnsnap/btrfs"
	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/leftover"
	"github.com/turnsnap/turnsnap/engine/room"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"github.com/turnsnap/turnsnap/overlay"
	"github.com/turnsnap/turnsnap/overlay/frozen"
)

// defaultBackend is the backend of a sandbox created without one (and of
// a leftover root nothing names).
const defaultBackend = overlay.Name

// newBackends makes the backends without options (at Open): the overlay
// backend, wired to the engine's services.
func newBackends(e *Engine, opts Options) map[string]rootfs.Backend {
	return map[string]rootfs.Backend{overlay.Name: newOverlay(e, opts)}
}

// newOverlay makes e's overlay backend: its frozen layers' policy reads
// the catalog and the store, checks the home's room, and yields to urgent
// checkpoints; with opts.TrackChanges it tracks its sandboxes' changes.
func newOverlay(e *Engine, opts Options) *overlay.Backend {
	ob := overlay.NewBackend(e.home.basesDir())
	ob.SetIDs(e.keys.IDs())
	ob.SetLoader(func() delta.BlobLoader { return e.data.repo }) // stacked roots' scans
	ob.SetTracking(opts.TrackChanges, e.log)
	ob.SetFreezing(frozen.Deps{
		Log: e.log,
		Keep: func() int {
			if e.config.FrozenKeep == nil {
				return frozen.DefaultKeep
			}
			return *e.config.FrozenKeep
		},
		OnBranch: opts.FreezeOnBranch,
		Loader:   func() delta.BlobLoader { return e.data.repo },
		View: func(ctx context.Context, fn func(frozen.Lines) error) error {
			return e.view(ctx, func(tx *catalog.Tx) error { return fn(tx) })
		},
		Room:      func(need uint64) error { return room.Check(string(e.home), e.cat, need, 0) },
		Phase:     e.phase,
		Shared:    e.shared,
		Yield:     e.locks.admit.Yield, // urgent checkpoints first (admit.go)
		Sandboxes: filepath.Join(string(e.home), "sandboxes"),
	})
	return ob
}

// setBackendIDs gives the backends that name content the home's (new) ID
// scheme.
func setBackendIDs(bs map[string]rootfs.Backend, ids delta.IDs) {
	for _, b := range implementing[interface{ SetIDs(delta.IDs) }](bs) {
		b.SetIDs(ids)
	}
}

// rootsInHome reports whether backend keeps its sandboxes' roots in the
// home (an overlay's layers), so making one needs the home's room.
func rootsInHome(backend string) bool { return backend == overlay.Name }

// backend returns the backend called name configured by a sandbox's stored
// options cfg (delta.Sandbox.Config; nil for none). Backends without
// options are made once, at Open; the others are made here, which also
// checks their options.
func (e *Engine) backend(name string, cfg json.RawMessage) (rootfs.Backend, error) {
	if b, ok := e.backends[name]; ok {
		return b, nil
	}
	if name == btrfs.Name {
		var o btrfs.Options
		if len(cfg) > 0 {
			if err := json.Unmarshal(cfg, &o); err != nil {
				return nil, fmt.Errorf("btrfs options %s: %v: %w", cfg, err, errdefs.ErrCorrupt)
			}
		}
		o.Logger = e.log
		o.IDs = e.keys.IDs()
		return btrfs.NewBackend(o)
	}
	have := []string{btrfs.Name}
	for n := range e.backends {
		have = append(have, n)
	}
	return nil, fmt.Errorf("backend %q is not available (have: %v): %w", name, have, errdefs.ErrInvalid)
}

// backendConfig is the stored form of a backend's options: the JSON of
// btrfs.Options for btrfs, nothing for backends without options.
func backendConfig(name string, b btrfs.Options) (json.RawMessage, error) {
	if name != btrfs.Name {
		if b != (btrfs.Options{}) {
			return nil, fmt.Errorf("btrfs options given for backend %q: %w", name, errdefs.ErrInvalid)
		}
		return nil, nil
	}
	return json.Marshal(b)
}

// leftovers are the creation markers of this home's creates and branches,
// and the roots killed ones left (engine/leftover).
func (e *Engine) leftovers() *leftover.Roots {
	return leftover.New(leftover.Deps{
		IntentsDir:     e.home.intentsDir(),
		SandboxDir:     func(name string) string { return e.home.sandboxDir(delta.SandboxName(name)) },
		Backend:        e.backend,
		DefaultBackend: defaultBackend,
		Log:            e.log,
	})
}
