package frozen

import "time"

// What the policy did, and knobs to hold it back: tests prove with them
// that a branch stacked on a layer it waited for, that a freeze paused for
// a turn, and act while freezes are held.

// Waited counts the branches that found their checkpoint's freeze pending.
func (k *Keeper) Waited() int64 { return k.freezes.waited.Load() }

// Paused counts the times a running freeze stopped for a turn in flight.
func (k *Keeper) Paused() int64 { return k.freezes.paused.Load() }

// Pending is how many freezes are queued or running.
func (k *Keeper) Pending() int {
	k.freezes.mu.Lock()
	defer k.freezes.mu.Unlock()
	return k.freezes.pending
}

// SetMaxDefer bounds how long a queued freeze waits for the engine to be
// idle (0: freezeMaxDefer).
func (k *Keeper) SetMaxDefer(d time.Duration) {
	k.freezes.mu.Lock()
	defer k.freezes.mu.Unlock()
	k.freezes.maxDefer = d
}

// TakeSlots takes all but keep of the background freezes' slots until
// release is called: no more than keep background freezes run meanwhile.
func (k *Keeper) TakeSlots(keep int) (release func()) {
	f := &k.freezes
	f.mu.Lock()
	f.initLocked()
	sem := f.sem
	f.mu.Unlock()
	n := max(cap(sem)-keep, 0)
	for range n {
		sem <- struct{}{}
	}
	return func() {
		for range n {
			<-sem
		}
	}
}

// ForgetLines empties the memo of retention's lines (a pass then decodes
// every live head's line again).
func (k *Keeper) ForgetLines() {
	k.lines.mu.Lock()
	defer k.lines.mu.Unlock()
	k.lines.lines = nil
}

// SetOnBranch switches Deps.OnBranch (tests set it on an open engine,
// before its first checkpoint).
func (k *Keeper) SetOnBranch(on bool) { k.d.OnBranch = on }
