// Package lazyrun owns the lazy restores an engine runs (docs/STORAGE.md,
// "Lazy restore"): each sandbox's filler (overlay/lazy) with its
// background fetch-ahead, the waits a checkpoint or rollback makes before
// it records the sandbox's state, their stop when the sandbox is removed
// or the engine closed, and the resume of a restore a killed process left.
// The engine makes one Runner and keeps the branch itself
// (Engine.BranchLazy): the layer's trees, the root, the catalog.
package lazyrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/overlay"
	"github.com/turnsnap/turnsnap/overlay/lazy"
)

// Config is what a Runner needs. The loader and the ID scheme are asked
// for at each restore: an engine replaces its content repository when a
// remote is configured or its catalog rebuilt, and its IDs when the home
// is initialised encrypted.
type Config struct {
	// Loader returns what reads trees and chunks (through the bucket),
	// verified against their IDs.
	Loader func() delta.BlobLoader
	// IDs returns the home's content ID scheme.
	IDs func() delta.IDs
	Log *slog.Logger
	// ReadOnly: the engine only reads; it resumes no restore (its fills
	// would write into the sandbox's root).
	ReadOnly bool
}

// Runner runs an engine's lazy restores, by sandbox. Its methods are safe
// for concurrent use; the sandbox's own operations are serialised by the
// engine's sandbox lock.
type Runner struct {
	cfg Config
	mu  sync.Mutex
	m   map[delta.SandboxName]*run
}

// run is one sandbox's lazy restore.
type run struct {
	f      *lazy.Filler
	cancel context.CancelFunc // stops the fetch-ahead
	done   chan struct{}      // closed when the fetch-ahead ended
	err    error              // its error, once done
}

// New makes a Runner with no restore running.
func New(cfg Config) *Runner {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Runner{cfg: cfg, m: map[delta.SandboxName]*run{}}
}

// FillerConfig is the overlay/lazy configuration of name's restore of
// tree into the root generation gen, whose writable layer is upper. The
// filler starts a keeper (lazy.Config.Keeper): an access while no engine
// runs waits rather than reading holes.
func (r *Runner) FillerConfig(name delta.SandboxName, gen, upper string, tree delta.ID) lazy.Config {
	return lazy.Config{Sandbox: string(name), Dir: gen, Upper: upper, Tree: tree,
		Loader: r.cfg.Loader(), IDs: r.cfg.IDs(), Log: r.cfg.Log, Keeper: true}
}

func (r *Runner) get(name delta.SandboxName) *run {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[name]
}

func (r *Runner) names() []delta.SandboxName {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]delta.SandboxName, 0, len(r.m))
	for n := range r.m {
		names = append(names, n)
	}
	return names
}

// Start runs f's fetch-ahead in the background, as name's restore, until
// it is whole or Stop or StopAll ends it.
func (r *Runner) Start(name delta.SandboxName, f *lazy.Filler) {
	ctx, cancel := context.WithCancel(context.Background())
	ru := &run{f: f, cancel: cancel, done: make(chan struct{})}
	r.mu.Lock()
	r.m[name] = ru
	r.mu.Unlock()
	go func() {
		defer close(ru.done)
		ru.err = f.FetchAhead(ctx, nil)
		if ru.err == nil {
			// Whole: the group (and its keeper) can go; accesses a dead
			// predecessor read but never answered are let through now,
			// onto filled files.
			_ = f.Close()
		} else if !errors.Is(ru.err, context.Canceled) {
			r.cfg.Log.Error("lazy restore: fetch-ahead", "sandbox", string(name), "err", ru.err)
		}
	}()
}

// stop ends name's lazy restore, if one runs: its fetch-ahead is cancelled
// and its listener closed. Unfilled files keep their markers and the state
// file (a later load of the sandbox resumes). detach leaves the keeper
// holding the group (the engine's close: accesses wait for the next
// engine); otherwise the keeper is stopped too (the sandbox's removal).
func (r *Runner) stop(name delta.SandboxName, detach bool) {
	r.mu.Lock()
	ru := r.m[name]
	delete(r.m, name)
	r.mu.Unlock()
	if ru == nil {
		return
	}
	ru.cancel()
	<-ru.done
	if detach {
		_ = ru.f.Detach()
	} else {
		_ = ru.f.Close()
	}
}

// Stop ends the restore of name, a sandbox being removed whose root is
// dir: its fills would write into the root. A keeper a killed process
// left for the root's live layer is released too.
func (r *Runner) Stop(name delta.SandboxName, dir string) {
	r.stop(name, false)
	if gen, _, err := overlay.LiveLayer(dir); err == nil {
		if err := lazy.Release(gen); err != nil {
			r.cfg.Log.Warn("lazy restore: keeper of a removed sandbox", "sandbox", string(name), "err", err)
		}
	}
}

// StopAll ends every restore for the engine's close, each keeper left
// holding its group: the next engine to load the sandbox resumes it.
func (r *Runner) StopAll() {
	for _, n := range r.names() {
		r.stop(n, true)
	}
}

// Status is the progress of a sandbox's lazy restore.
type Status struct {
	Running bool // a restore runs in this engine
	lazy.Stats
	// Whole: every file is filled and synced.
	Whole bool
	// Err is the fetch-ahead's error once it stopped on one, else the
	// last fill's (an object missing or corrupt), if any.
	Err error
}

// Status reports name's lazy restore.
func (r *Runner) Status(name delta.SandboxName) Status {
	ru := r.get(name)
	if ru == nil {
		return Status{}
	}
	st := Status{Running: true, Stats: ru.f.Stats(), Err: ru.f.Err()}
	select {
	case <-ru.f.Done():
		st.Whole = true
	default:
	}
	select {
	case <-ru.done:
		if ru.err != nil && !errors.Is(ru.err, context.Canceled) {
			st.Err = ru.err
		}
	default:
	}
	return st
}

// Wait waits until name's lazy restore is whole (every file filled and
// synced), and returns its error if its fetch-ahead failed (a missing or
// corrupt object, named). A sandbox with no lazy restore returns at once.
// An operation that records or replaces the sandbox's state (checkpoint,
// rollback) calls it after loading the sandbox (which resumed a restore
// a restart cut off), so no placeholder is ever recorded.
func (r *Runner) Wait(ctx context.Context, name delta.SandboxName) error {
	ru := r.get(name)
	if ru == nil {
		return nil
	}
	select {
	case <-ru.f.Done():
		return nil
	case <-ru.done:
		if ru.err != nil {
			return ru.err
		}
		return ru.f.Wait(ctx)
	case <-ctx.Done():
		return fmt.Errorf("sandbox %s: waiting for its lazy restore: %w", name, ctx.Err())
	}
}

// WaitAll waits for every restore running (the CLI without a daemon calls
// it before it exits: its process is the listener) and joins their errors.
func (r *Runner) WaitAll(ctx context.Context) error {
	var errs []error
	for _, n := range r.names() {
		errs = append(errs, r.Wait(ctx, n))
	}
	return errors.Join(errs...)
}

// Resume takes over a lazy restore a killed process left in name's overlay
// root dir (its live generation's state file says incomplete): its
// placeholders are marked again and filled from the start. One whose
// placeholders were not all made (cut off before the branch was
// published) is made again by redo, which materialises tree whole into
// the root's layer. Loading a sandbox calls it, so the first use of the
// sandbox after a restart finishes its restore. A restore running here,
// or a read-only engine, is left alone.
func (r *Runner) Resume(ctx context.Context, name delta.SandboxName, dir string, redo func(ctx context.Context, tree delta.ID) error) error {
	if r.cfg.ReadOnly || r.get(name) != nil {
		return nil
	}
	gen, upper, err := overlay.LiveLayer(dir)
	if err != nil {
		return nil // no live layer: nothing lazy here
	}
	ls, err := lazy.ReadState(gen)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", name, err)
	}
	if !ls.Incomplete {
		return nil
	}
	if !ls.Ready {
		r.cfg.Log.Warn("lazy restore: placeholders incomplete, restoring the layer again", "sandbox", string(name))
		return redo(ctx, ls.Tree)
	}
	f, err := lazy.Recover(ctx, r.FillerConfig(name, gen, upper, ls.Tree))
	if err != nil {
		return err
	}
	r.cfg.Log.Info("lazy restore: resumed after a restart", "sandbox", string(name), "pending", f.Stats().Pending)
	r.Start(name, f)
	return nil
}
