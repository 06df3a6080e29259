package frozen

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnsnap/turnsnap/delta"
)

// Background freezes (docs/ARCHITECTURE.md, "Frozen layers"). A committed
// overlay checkpoint's layer is frozen after the checkpoint call returns,
// so the turn's latency never includes it. The Keeper owns every freeze:
//
//   - One at a time per sandbox, in checkpoint order (each waits for the
//     sandbox's previous one, whose layer it then builds from), and at most
//     backgroundFreezes() at once per engine, each once the engine is idle
//     (idle.go) unless someone needs it now, and pausing between
//     entries while a checkpoint is in flight.
//   - It takes no sandbox lock, so the sandbox's next checkpoint never
//     waits for it. It can still never publish a wrong layer: it reads the
//     live upper only for file bytes, each chunk hashed against the
//     checkpoint's tree (a file that changed since the cut comes from the
//     store), and takes every name, type, mode, owner, time, xattr,
//     symlink target, hardlink and directory from the tree, never from the
//     live root.
//   - It holds the engine's shared lock while it runs (maintenance waits
//     for it); it waits for that lock only once it has its turn, so an
//     operation holding the lock never waits for a job that waits for it:
//     a branch of a checkpoint whose freeze has not started yet builds the
//     layer itself (awaitFreeze), and waits only for one that is running.
//   - Each runs on the Keeper's context: Close cancels it and waits for
//     every freeze, so a build in progress stops at its next entry and its
//     unpublished .tmp-* is removed; one not started yet never starts. A
//     process killed meanwhile leaves only such a .tmp-* build, which the
//     next freeze or prune sweeps.

// PhaseStart is reached when a background freeze (or a branch that
// builds the layer itself) starts building a checkpoint's layer.
const PhaseStart = "freeze-start"

// backgroundFreezes bounds the engine's concurrent background freezes: a
// quarter of the cores, at least one. Each is disk and CPU work (links,
// copies, one syncfs) that no client waits for, and Go schedules its
// goroutines level with the turns': with one freeze per core, a turn that
// arrived while freezes ran waited for a core (in BenchmarkConcurrentTurns'
// paced phase, 2 cores, p99 4.9-8.9x the uncontended turn; with one freeze
// and the pauses of idle.go, 2.7-4.3x, in interleaved runs).
func backgroundFreezes() int { return max(1, runtime.GOMAXPROCS(0)/4) }

// freezeJobs is the Keeper's set of pending freezes.
type freezeJobs struct {
	mu     sync.Mutex
	sem    chan struct{}
	byTree map[delta.ID]*freezeJob
	last   map[string]*freezeJob // the newest job of each sandbox
	closed bool
	// pending counts the jobs' goroutines; idle is signalled as it drops.
	pending int
	idle    sync.Cond
	// waited counts branches that found their checkpoint's freeze pending
	// (tests prove a branch stacked on a layer it waited for).
	waited atomic.Int64
	// paused counts the times a running freeze stopped for a checkpoint
	// in flight (pause, idle.go).
	paused atomic.Int64
	// When the engine is idle (idle.go): checkpoints in flight,
	// when the last one ended, closed and replaced to wake the waiting
	// freezes, and WaitFreezes callers (who want every freeze now).
	busy     int
	lastEnd  time.Time
	kick     chan struct{}
	draining int
	maxDefer time.Duration // 0: freezeMaxDefer (tests set it)
}

// freezeJob is one checkpoint's pending freeze, with what it needs of the
// moment of the checkpoint.
type freezeJob struct {
	cp      *delta.Checkpoint
	sandbox string
	parent  delta.ID // the parent checkpoint's fs tree
	live    string   // the writable layer the checkpoint was scanned from
	// room is what the build may write when it is more than what the
	// checkpoint read (a layer built from nothing for a branch: the tree).
	room   uint64
	prev   *freezeJob
	done   chan struct{}
	queued time.Time
	// Under freezeJobs.mu: whether someone builds it, whether a branch
	// waits for it (then it is built even if no retention rule keeps it),
	// and whether it is needed now (it does not wait for idle).
	claimed bool
	waiters int
	rush    bool
}

// FreezeLater queues the freeze of cp, just committed in sandbox, whose
// head was parent (the parent checkpoint's fs tree; zero for none).
func (k *Keeper) FreezeLater(sandbox string, parent delta.ID, cp *delta.Checkpoint) {
	if k.keep() == 0 || k.d.Layers.Has(cp.FSTree) {
		return
	}
	if k.d.OnBranch && k.sourceLayer(sandbox, parent).IsZero() {
		return // a layer from nothing waits for a branch that wants it
	}
	live, err := k.d.LiveUpper(k.sandboxDir(sandbox))
	if err != nil {
		k.d.Log.Warn("frozen layer not kept; branches of this checkpoint copy it", "sandbox", sandbox, "checkpoint", cp.ID.Short(), "err", err)
		return
	}
	j := &freezeJob{cp: cp, sandbox: sandbox, live: live, parent: parent, done: make(chan struct{}), queued: time.Now()}
	f := &k.freezes
	f.mu.Lock()
	if f.closed || f.byTree[cp.FSTree] != nil {
		f.mu.Unlock()
		return // closing, or the same tree queued already
	}
	f.initLocked()
	j.prev = f.last[j.sandbox]
	f.last[j.sandbox], f.byTree[cp.FSTree] = j, j
	f.pending++
	f.mu.Unlock()
	go k.runFreeze(j)
}

// initLocked makes the job maps and the slots on first use. The caller
// holds f.mu.
func (f *freezeJobs) initLocked() {
	if f.byTree == nil {
		f.byTree, f.last = map[delta.ID]*freezeJob{}, map[string]*freezeJob{}
		f.sem = make(chan struct{}, backgroundFreezes())
	}
}

// runFreeze is a queued freeze's goroutine.
func (k *Keeper) runFreeze(j *freezeJob) {
	f := &k.freezes
	defer func() {
		f.mu.Lock()
		f.pending--
		f.idleCond().Broadcast()
		f.mu.Unlock()
	}()
	if j.prev != nil {
		<-j.prev.done
	}
	f.waitIdle(j)
	ctx := k.ctx
	if k.d.Yield != nil {
		k.d.Yield(ctx) // urgent checkpoints first
	}
	f.sem <- struct{}{}
	defer func() { <-f.sem }()
	if k.d.Shared != nil {
		defer k.d.Shared()()
	}
	f.mu.Lock()
	mine := !j.claimed
	j.claimed = true
	f.mu.Unlock()
	if !mine {
		return // a branch built it
	}
	if ctx.Err() != nil {
		f.finish(j) // closing: a freeze not started never starts
		return
	}
	// One look at retention serves both the question whether to build and
	// which layers the build may reuse (it is a pass over every sandbox).
	keep, err := k.KeepSet(ctx)
	built := false
	if k.stillWanted(j, keep, err) {
		if err != nil {
			keep = nil // freeze looks again
		}
		k.freeze(ctx, j, keep)
		built = true
	}
	// A job skipped changed nothing on disk: the retention pass is left to
	// the sandbox's next freeze, unless this was its newest.
	if newest := f.finish(j); !built && !newest {
		return
	}
	if ctx.Err() != nil {
		return // closing: the next process's passes prune
	}
	if err := k.prune(ctx, j.cp.Created); err != nil {
		k.d.Log.Warn("frozen layers not pruned", "err", err)
	}
}

// stillWanted reports whether j's layer is worth building when its turn
// comes: a branch waits for it, or retention (keep, or kerr when it could
// not be read) keeps it (not when the sandbox moved on past it meanwhile,
// or is gone).
func (k *Keeper) stillWanted(j *freezeJob, keep map[delta.ID]bool, kerr error) bool {
	k.freezes.mu.Lock()
	waited := j.waiters > 0
	k.freezes.mu.Unlock()
	return waited || kerr != nil || keep[j.cp.FSTree]
}

// finish marks j done and reports whether it was its sandbox's newest
// pending freeze.
func (f *freezeJobs) finish(j *freezeJob) (newest bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(j.done)
	if f.byTree[j.cp.FSTree] == j {
		delete(f.byTree, j.cp.FSTree)
	}
	if f.last[j.sandbox] == j {
		delete(f.last, j.sandbox)
		newest = true
	}
	return newest
}

// awaitFreeze returns once tree has no pending freeze: it waits for one
// that is running, or builds one not started yet itself (after the
// sandbox's earlier freeze, whose layer it builds from). The caller holds
// the engine's shared lock.
func (k *Keeper) awaitFreeze(ctx context.Context, tree delta.ID) error {
	f := &k.freezes
	counted := false
	for {
		f.mu.Lock()
		j := f.byTree[tree]
		if j == nil {
			f.mu.Unlock()
			return nil
		}
		if !counted {
			counted = true
			f.waited.Add(1)
			f.rushLocked(j)
		}
		if j.claimed {
			j.waiters++
			f.mu.Unlock()
			select {
			case <-j.done:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if p := j.prev; p != nil && !closed(p.done) {
			f.mu.Unlock()
			select {
			case <-p.done:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		j.claimed = true
		j.waiters++
		f.mu.Unlock()
		k.freeze(ctx, j, nil)
		f.finish(j)
		return nil
	}
}

func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (f *freezeJobs) idleCond() *sync.Cond {
	if f.idle.L == nil {
		f.idle.L = &f.mu
	}
	return &f.idle
}

// wait returns once no freeze is pending; with stop, no new one starts.
// The pending ones start at once (without waiting for the engine to be
// idle).
func (f *freezeJobs) wait(stop bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = f.closed || stop
	f.draining++
	defer func() { f.draining-- }()
	f.kickLocked()
	for f.pending > 0 {
		f.idleCond().Wait()
	}
}

// WaitFreezes waits until no background freeze is pending, the retention
// pass after each included (tools, benchmarks and tests).
func (k *Keeper) WaitFreezes() { k.freezes.wait(false) }

// Close stops the background freezes: it cancels the ones running (each
// stops at its next entry and removes its unpublished build), keeps those
// not started from starting, and returns once none is left, and the
// layers Prune removed are deleted.
func (k *Keeper) Close() {
	k.cancel()
	k.freezes.wait(true)
	k.d.Layers.WaitRemovals()
}
