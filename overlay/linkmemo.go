package overlay

import (
	"slices"
	"sync"
)

// linkMemo keeps the hardlink groups of the lower directories (bases and
// frozen layers) a Backend's roots sit on, so that each new root does not
// walk a whole lower again to find them: a fan-out of 64 branches of a
// 50,000-file frozen layer walked it 64 times (the per-sandbox file cache,
// lowerLinksFile, starts empty in a new sandbox), which made a branch's
// cost grow with the parent's file count (BenchmarkScaleFanout, engine).
// A base and a published frozen layer are never written, and one made
// again at the same path is another inode set with another root handle,
// so the groups of one (directory, root handle) never change. Concurrent
// roots asking for the same lower wait for one walk. Safe for concurrent
// use.
type linkMemo struct {
	mu sync.Mutex
	m  map[linkKey]*linkEntry
}

type linkKey struct{ dir, handle string }

type linkEntry struct {
	mu     sync.Mutex // held during the walk
	done   bool
	groups []linkGroup
}

// linkMemoMax bounds the lowers kept (a few bases and the frozen layers
// retention keeps); past it, the memo starts again empty.
const linkMemoMax = 128

// groups returns the groups of lower dir (its root's handle), from the
// memo or, once for all concurrent callers, from walk. A failed walk is
// not kept. Callers must not modify the groups.
func (lm *linkMemo) groups(dir, handle string, walk func() ([]linkGroup, error)) ([]linkGroup, error) {
	if lm == nil {
		return walk()
	}
	k := linkKey{dir, handle}
	lm.mu.Lock()
	e := lm.m[k]
	if e == nil {
		if lm.m == nil || len(lm.m) >= linkMemoMax {
			lm.m = map[linkKey]*linkEntry{}
		}
		e = &linkEntry{}
		lm.m[k] = e
	}
	lm.mu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.done {
		return e.groups, nil
	}
	g, err := walk()
	if err != nil {
		return nil, err
	}
	// Clipped: a caller appending to the shared slice gets its own copy.
	e.groups, e.done = slices.Clip(g), true
	return e.groups, nil
}
