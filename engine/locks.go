package engine

import (
	"context"
	"fmt"
	"sync"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/rootfs"
)

// Concurrency (docs/ARCHITECTURE.md, "Concurrency"). An Engine serves
// concurrent operations:
//
//   - Operations on one sandbox (checkpoint, rollback, create, branch into
//     it, remove, diff of its live root, restore of paths) hold that
//     sandbox's lock, so they run one at a time, in the order they arrived.
//   - Operations on different sandboxes run side by side. Each carries its
//     own pending writes (a content.Op); shared state is the catalog (short
//     transactions), the content repository (safe for concurrent use) and
//     the host's bases (prepared under baseMu).
//   - A checkpoint, once it holds its sandbox's lock, also waits for one of
//     the engine's checkpoint slots (engine/admission): at most
//     MaxCheckpoints run at once, urgent ones admitted first.
//   - Home-wide maintenance (gc, prune, catalog rebuild, init) holds the
//     engine's exclusive lock: no turn runs during it. Every other operation
//     holds it shared.
//
// Between processes the home's flock still serialises whole commands.

// sandboxLocks hands out one FIFO lock per sandbox name.
type sandboxLocks struct {
	mu sync.Mutex
	m  map[string]*fifoLock
}

// fifoLock is held or not; waiters are served in arrival order.
type fifoLock struct {
	held    bool
	waiters []chan struct{}
}

// lock waits for sandbox name's lock; unlock releases it.
func (l *sandboxLocks) lock(ctx context.Context, name string) (unlock func(), err error) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*fifoLock{}
	}
	f := l.m[name]
	if f == nil {
		f = &fifoLock{}
		l.m[name] = f
	}
	if !f.held {
		f.held = true
		l.mu.Unlock()
		return func() { l.unlock(name) }, nil
	}
	ch := make(chan struct{})
	f.waiters = append(f.waiters, ch)
	l.mu.Unlock()
	select {
	case <-ch: // handed over by unlock
		return func() { l.unlock(name) }, nil
	case <-ctx.Done():
		l.mu.Lock()
		defer l.mu.Unlock()
		for i, w := range f.waiters {
			if w == ch {
				f.waiters = append(f.waiters[:i], f.waiters[i+1:]...)
				return nil, fmt.Errorf("waiting for another operation on sandbox %s: %w", name, ctx.Err())
			}
		}
		// unlock handed the lock over just as ctx ended: pass it on.
		l.mu.Unlock()
		l.unlock(name)
		l.mu.Lock()
		return nil, fmt.Errorf("waiting for another operation on sandbox %s: %w", name, ctx.Err())
	}
}

func (l *sandboxLocks) unlock(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.m[name]
	if len(f.waiters) > 0 {
		next := f.waiters[0]
		f.waiters = f.waiters[1:]
		close(next) // the lock stays held, by next
		return
	}
	f.held = false
	delete(l.m, name)
}

// op begins an operation on sandbox name: the engine's shared lock, then
// the sandbox's. done releases both.
func (e *Engine) op(ctx context.Context, name delta.SandboxName) (done func(), err error) {
	e.locks.maint.RLock()
	unlock, err := e.locks.sandboxes.lock(ctx, string(name))
	if err != nil {
		e.locks.maint.RUnlock()
		return nil, err
	}
	return func() { unlock(); e.locks.maint.RUnlock() }, nil
}

// shared begins an operation that touches no one sandbox's root (verify,
// log, tags, push): it only keeps maintenance out.
func (e *Engine) shared() (done func()) {
	e.locks.maint.RLock()
	return e.locks.maint.RUnlock
}

// exclusive begins home-wide maintenance: it waits for every operation in
// flight and keeps new ones out until done.
func (e *Engine) exclusive() (done func()) {
	e.locks.maint.Lock()
	return e.locks.maint.Unlock
}

// prepareBase makes base tree available through be. Concurrent operations
// on new sandboxes of one base would otherwise race to publish it.
func (e *Engine) prepareBase(ctx context.Context, be rootfs.Backend, tree delta.ID, loader delta.BlobLoader) (string, error) {
	e.locks.base.Lock()
	defer e.locks.base.Unlock()
	return be.PrepareBase(ctx, tree, loader)
}

// commitLock is what a commit transaction (Engine.commits) holds: commitMu,
// and the repository's index lock, since a small turn's blob index is
// written in that transaction (content.Staged). The repository is the one
// of the moment: maintenance replaces it only under the exclusive lock,
// which no commit runs under.
type commitLock struct {
	e    *Engine
	held *sync.Mutex // the index lock taken, guarded by commitMu
}

func (l *commitLock) Lock() {
	l.e.locks.commit.Lock()
	l.held = l.e.data.repo.IndexLock()
	l.held.Lock()
}

func (l *commitLock) Unlock() {
	l.held.Unlock()
	l.e.locks.commit.Unlock()
}
