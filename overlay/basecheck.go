package overlay

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/overlay/basewatch"
)

// baseTrust bounds how long a clean watch stands in for CheckBase's stat
// walk: a write through a shared mmap raises no event (basewatch), and the
// walk every baseTrust would still see its mtime.
const baseTrust = 10 * time.Minute

// baseWatches are the watches of the bases CheckBase found intact: while
// one is clean (nothing below the base changed since it was armed, before
// that check), a restore's check of the base is free instead of a stat
// per entry (1.4-2.9 s at 150,000 files).
type baseWatches struct {
	mu sync.Mutex
	m  map[delta.ID]*basewatch.Watch
	// walked and trusted count CheckBase's answers (BaseCheckStats).
	walked, trusted atomic.Int64
}

// BaseCheckStats counts the backend's checks of its bases: Walked looked
// at every entry; Trusted answered from a clean watch.
type BaseCheckStats struct{ Walked, Trusted int64 }

// BaseCheckStats reports the backend's checks of its bases so far.
func (b *Backend) BaseCheckStats() BaseCheckStats {
	return BaseCheckStats{Walked: b.watches.walked.Load(), Trusted: b.watches.trusted.Load()}
}

// clean reports whether tree's base has a clean watch younger than
// baseTrust; a dirty or old one is dropped.
func (ws *baseWatches) clean(tree delta.ID, now time.Time) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w := ws.m[tree]
	if w == nil {
		return false
	}
	if w.Dirty() || now.Sub(w.Armed()) > baseTrust {
		w.Close()
		delete(ws.m, tree)
		return false
	}
	ws.trusted.Add(1)
	return true
}

// arm arms a watch of tree's base at dst before it is checked; nil when
// the kernel refuses (the check then walks every time, as without one).
func (ws *baseWatches) arm(ctx context.Context, dst string) *basewatch.Watch {
	ws.walked.Add(1)
	w, err := basewatch.Arm(ctx, dst)
	if err != nil {
		return nil
	}
	return w
}

// keep keeps w, armed before a check of tree's base that passed, as the
// base's watch; a check that failed closes it.
func (ws *baseWatches) keep(tree delta.ID, w *basewatch.Watch, passed bool) {
	if w == nil {
		return
	}
	if !passed {
		w.Close()
		return
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.m == nil {
		ws.m = map[delta.ID]*basewatch.Watch{}
	}
	if old := ws.m[tree]; old != nil {
		old.Close()
	}
	ws.m[tree] = w
}

// closeAll drops every watch (the backend's Close).
func (ws *baseWatches) closeAll() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for t, w := range ws.m {
		w.Close()
		delete(ws.m, t)
	}
}
