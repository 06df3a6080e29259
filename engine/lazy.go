package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
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

// lazyRestores are the lazy restores this engine runs, by sandbox.
type lazyRestores struct {
	mu sync.Mutex
	m  map[delta.SandboxName]*lazyRun
}

// lazyRun is one sandbox's lazy restore.
type lazyRun struct {
	f      *lazy.Filler
	cancel context.CancelFunc // stops the fetch-ahead
	done   chan struct{}      // closed when the fetch-ahead ended
	err    error              // its error, once done
}

func (l *lazyRestores) get(name delta.SandboxName) *lazyRun {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m[name]
}

func (l *lazyRestores) put(name delta.SandboxName, r *lazyRun) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[delta.SandboxName]*lazyRun{}
	}
	l.m[name] = r
}

// stop ends name's lazy restore, if one runs: its fetch-ahead is cancelled
// and its listener closed. Unfilled files keep their markers and the state
// file (a later load of the sandbox resumes). detach leaves the keeper
// holding the group (the engine's close: accesses wait for the next
// engine); otherwise the keeper is stopped too (the sandbox's removal).
func (l *lazyRestores) stop(name delta.SandboxName, detach bool) {
	l.mu.Lock()
	r := l.m[name]
	delete(l.m, name)
	l.mu.Unlock()
	if r != nil {
		r.cancel()
		<-r.done
		if detach {
			_ = r.f.Detach()
		} else {
			_ = r.f.Close()
		}
	}
}

// stopLazy is stop for a sandbox being removed: also a keeper a killed
// process left for its root.
func (e *Engine) stopLazy(name delta.SandboxName) {
	e.lazy.stop(name, false)
	if gen, _, err := overlay.LiveLayer(e.home.sandboxDir(name)); err == nil {
		if err := lazy.Release(gen); err != nil {
			e.log.Warn("lazy restore: keeper of a removed sandbox", "sandbox", string(name), "err", err)
		}
	}
}

func (l *lazyRestores) stopAll() {
	l.mu.Lock()
	names := make([]delta.SandboxName, 0, len(l.m))
	for n := range l.m {
		names = append(names, n)
	}
	l.mu.Unlock()
	for _, n := range names {
		l.stop(n, true)
	}
}

// LazyStatus is the progress of a sandbox's lazy restore.
type LazyStatus struct {
	Running bool // a restore runs in this engine
	lazy.Stats
	Err error // the last fill's error (an object missing or corrupt), if any
}

// LazyStatus reports name's lazy restore on this engine.
func (e *Engine) LazyStatus(name delta.SandboxName) LazyStatus {
	r := e.lazy.get(name)
	if r == nil {
		return LazyStatus{}
	}
	return LazyStatus{Running: true, Stats: r.f.Stats(), Err: r.f.Err()}
}

// BranchLazy is Branch for a checkpoint whose chunks this host lacks (a
// fresh home restoring from the bucket): the new sandbox's root is mounted
// as soon as its layer's trees are read, every file a placeholder filled
// on first access, and a fetch-ahead fills the rest in the background
// (WaitLazy waits for it). Overlay roots only (pre-content marks need the
// upper's filesystem: ext4, btrfs or xfs), files only: a checkpoint with
// processes needs FSOnly. The result has no receipt: each file is checked
// as it is filled (every chunk against its ID, its size against the
// tree), and WaitLazy returns the restore's outcome.
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
		f, err = lazy.Restore(ctx, e.lazyConfig(newName, gen, upper, cp.FSTree))
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
	e.startLazy(newName, f)
	return &RestoreResult{Sandbox: string(newName), Checkpoint: cp, Root: root.Path(), Duration: time.Since(start)}, nil
}

func (e *Engine) lazyConfig(name delta.SandboxName, gen, upper string, tree delta.ID) lazy.Config {
	return lazy.Config{Sandbox: string(name), Dir: gen, Upper: upper, Tree: tree, Loader: e.data.repo, IDs: e.keys.IDs(), Log: e.log, Keeper: true}
}

// startLazy runs f's fetch-ahead in the background; the engine's close
// stops it.
func (e *Engine) startLazy(name delta.SandboxName, f *lazy.Filler) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &lazyRun{f: f, cancel: cancel, done: make(chan struct{})}
	e.lazy.put(name, r)
	go func() {
		defer close(r.done)
		r.err = f.FetchAhead(ctx, nil)
		if r.err == nil {
			// Whole: the group (and its keeper) can go; accesses a dead
			// predecessor read but never answered are let through now,
			// onto filled files.
			_ = f.Close()
		} else if !errors.Is(r.err, context.Canceled) {
			e.log.Error("lazy restore: fetch-ahead", "sandbox", string(name), "err", r.err)
		}
	}()
}

// WaitLazy waits until name's lazy restore is whole (every file filled and
// synced), and returns its error if its fetch-ahead failed (a missing or
// corrupt object, named). A sandbox with no lazy restore returns at once.
func (e *Engine) WaitLazy(ctx context.Context, name delta.SandboxName) error {
	r := e.lazy.get(name)
	if r == nil {
		return nil
	}
	select {
	case <-r.f.Done():
		return nil
	case <-r.done:
		if r.err != nil {
			return r.err
		}
		return r.f.Wait(ctx)
	case <-ctx.Done():
		return fmt.Errorf("sandbox %s: waiting for its lazy restore: %w", name, ctx.Err())
	}
}

// WaitLazyAll waits for every lazy restore of this engine (the CLI without
// a daemon calls it before it exits) and returns their errors.
func (e *Engine) WaitLazyAll(ctx context.Context) error {
	e.lazy.mu.Lock()
	names := make([]delta.SandboxName, 0, len(e.lazy.m))
	for n := range e.lazy.m {
		names = append(names, n)
	}
	e.lazy.mu.Unlock()
	var errs []error
	for _, n := range names {
		errs = append(errs, e.WaitLazy(ctx, n))
	}
	return errors.Join(errs...)
}

// resumeLazy takes over a lazy restore a killed process left in st's root
// (its live generation's state file says incomplete): its placeholders are
// marked again and filled from the start. One whose placeholders were not
// all made is made again. Loading a sandbox calls it, so the first use of
// the sandbox after a restart finishes its restore.
func (e *Engine) resumeLazy(ctx context.Context, st *sandboxState) error {
	if st.sb.Backend != overlay.Name || e.lazy.get(st.name) != nil || e.opts.ReadOnly {
		return nil
	}
	gen, upper, err := overlay.LiveLayer(e.home.sandboxDir(st.name))
	if err != nil {
		return nil // no live layer: nothing lazy here
	}
	ls, err := lazy.ReadState(gen)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", st.name, err)
	}
	if !ls.Incomplete {
		return nil
	}
	if !ls.Ready {
		// Cut off while its placeholders were made, before the branch was
		// published: a fresh materialisation of the tree replaces it.
		e.log.Warn("lazy restore: placeholders incomplete, restoring the layer again", "sandbox", string(st.name))
		if err := st.root.Restore(ctx, ls.Tree, e.data.repo); err != nil {
			return err
		}
		return nil
	}
	f, err := lazy.Recover(ctx, e.lazyConfig(st.name, gen, upper, ls.Tree))
	if err != nil {
		return err
	}
	e.log.Info("lazy restore: resumed after a restart", "sandbox", string(st.name), "pending", f.Stats().Pending)
	e.startLazy(st.name, f)
	return nil
}

// wholeForWrite is what an operation that records or replaces a sandbox's
// state (checkpoint, rollback) calls after loading it (which resumed a
// restore a restart cut off): a lazy restore in progress is finished
// first, so its placeholders are never recorded.
func (e *Engine) wholeForWrite(ctx context.Context, st *sandboxState) error {
	return e.WaitLazy(ctx, st.name)
}
