package engine

import (
	"sync"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/statememo"
)

// headTrees keeps, per sandbox, the trees its last committed turn made, so
// that the next turn's comparison with the head (mergedChanged) finds the
// head's trees in memory instead of locating each through the catalog: on
// a busy daemon every such read waited for the other turns' commits in
// flight. A tree's ID is the hash of its bytes, so an entry is right for
// ever, whatever the sandbox did since (a rollback only makes it miss).
type headTrees struct {
	mu        sync.Mutex
	bySandbox map[string]*statememo.Trees
}

// headTreesMax bounds what one sandbox keeps: a small turn's trees are a
// few KiB, and a large turn's are read from the store as before.
const headTreesMax = 64 << 10

// loader returns the trees kept for name in front of next.
func (h *headTrees) loader(name string, next delta.BlobLoader) delta.BlobLoader {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m := h.bySandbox[name]; m != nil {
		return m.Over(next)
	}
	return next
}

// keep records the trees of name's turn just committed (memo's), if small.
func (h *headTrees) keep(name string, memo *statememo.Trees) {
	size := memo.Size()
	h.mu.Lock()
	defer h.mu.Unlock()
	if size > headTreesMax {
		delete(h.bySandbox, name)
		return
	}
	if h.bySandbox == nil {
		h.bySandbox = map[string]*statememo.Trees{}
	}
	h.bySandbox[name] = memo.Over(nil) // the trees, not the turn's loader
}

// drop forgets name's trees (the sandbox is removed).
func (h *headTrees) drop(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.bySandbox, name)
}
