package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/lazyrun"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/overlay"
	"github.com/turnsnap/turnsnap/overlay/lazy"
)

// Lazy restore (docs/STORAGE.md, "Lazy restore"): a branch whose layer's
// chunks are not on this host starts once the layer's trees are, with its
// files as placeholders that a fanotify pre-content listener (overlay/lazy)
// fills on first open, while a fetch-ahead fills the rest. The sandbox's
// state is whole only once every file is filled: a checkpoint or rollback
// of it waits for that, so no placeholder is ever recorded.

// Lazy returns the engine's lazy restores (engine/lazyrun): their
// progress, and the waits for them to be whole.
func (e *Engine) Lazy() *lazyrun.Runner { return e.lazy }

// BranchLazy is Branch for a checkpoint whose chunks this host lacks (a
// fresh home restoring from the bucket): the new sandbox's root is mounted
// as soon as its layer's trees are read, every file a placeholder filled
// on first access, and a fetch-ahead fills the rest in the background
// (Lazy().Wait waits for it). Overlay roots only (pre-content marks need the
// upper's filesystem: ext4, btrfs or xfs), files only: a checkpoint with
// processes needs FSOnly. The result has no receipt: each file is checked
// as it is filled (every chunk against its ID, its size against the
// tree), and Lazy().Wait returns the restore's outcome.
func (e *Engine) BranchLazy(ctx context.Context, ref catalog.CheckpointRef, newName delta.SandboxName, o BranchOptions) (*RestoreResult, error) {
	if !delta.ValidRefName(string(newName)) {
		return nil, fmt.Errorf("sandbox name %q: use 1-64 of [A-Za-z0-9._-], not starting with '.' or '-': %w", newName, errdefs.ErrInvalid)
	}
	if o.Materialise {
		return nil, fmt.Errorf("sandbox %s: a lazy branch does not materialise: %w", newName, errdefs.ErrInvalid)
	}
	done, err := e.op(ctx, newName)
	if err != nil {
		return nil, err
	}
	defer done()
	start := time.Now()
	cp, err := e.resolveFor(ctx, "", ref)
	if err != nil {
		return nil, err
	}
	if cp.ProcTree != nil && !o.FSOnly {
		return nil, fmt.Errorf("sandbox %s: checkpoint %s has processes, which a lazy branch does not restore (pass fs-only): %w", newName, cp.ID.Short(), errdefs.ErrInvalid)
	}
	if err := e.checkNewSandbox(ctx, string(newName)); err != nil {
		return nil, err
	}
	var cfg json.RawMessage
	if o.Backend == "" {
		o.Backend = cp.Backend
		// Never another home's pool (foreign.go).
		if cfg, err = branchConfig(ctx, e.cat, e.home, e.config.HomeID, cp); err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", newName, err)
		}
	} else if cfg, err = backendConfig(o.Backend, o.Btrfs); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", newName, err)
	}
	if o.Backend != overlay.Name {
		return nil, fmt.Errorf("sandbox %s: lazy restore needs an overlay root, not %s: %w", newName, o.Backend, errdefs.ErrInvalid)
	}
	be, err := e.backend(o.Backend, cfg)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", newName, err)
	}
	ob, ok := be.(*overlay.Backend)
	if !ok {
		return nil, fmt.Errorf("sandbox %s: lazy restore needs an overlay root: %w", newName, errdefs.ErrInvalid)
	}
	// The layer's trees, all of them, before anything is made: a branch
	// that starts must not find a tree missing later.
	if _, err := delta.CheckState(ctx, e.data.repo, cp.FSTree, delta.StateRules{}); err != nil {
		return nil, fmt.Errorf("checkpoint %s: tree %s: %w", cp.ID.Short(), cp.FSTree.Short(), err)
	}
	lower, err := e.prepareBase(ctx, be, cp.BaseTree, e.data.repo)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", newName, err)
	}
	if _, err := checkBaseOn(ctx, be, cp.BaseTree, false); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", newName, err)
	}
	dir := e.home.sandboxDir(newName)
	if err := ensureDir(filepath.Dir(dir)); err != nil {
		return nil, err
	}
	unmark, err := e.leftovers().Creating([]string{string(newName)}, o.Backend, cfg)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", newName, err)
	}
	var f *lazy.Filler
	root, err := ob.CreateWith(ctx, dir, lower, func(ctx context.Context, gen, upper string) error {
		var err error
		f, err = lazy.Restore(ctx, e.lazy.FillerConfig(newName, gen, upper, cp.FSTree))
		return err
	})
	if err != nil {
		if f != nil {
			_ = f.Close()
		}
		return nil, err
	}
	sb := &delta.Sandbox{ID: delta.NewSandboxID(), Home: e.config.HomeID, Name: newName, Backend: o.Backend, Config: cfg,
		BaseTree: cp.BaseTree, Origin: cp.ID, Created: time.Now().UTC()}
	if err := e.publishSandboxes(ctx, []*delta.Sandbox{sb}, cp.ID); err != nil {
		_ = f.Close()
		if root.Remove(context.WithoutCancel(ctx)) == nil {
			unmark()
		}
		return nil, err
	}
	unmark()
	e.lazy.Start(newName, f)
	return &RestoreResult{Sandbox: string(newName), Checkpoint: cp, Root: root.Path(), Duration: time.Since(start)}, nil
}
