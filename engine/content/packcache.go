package content

import (
	"sync"

	"github.com/turnsnap/turnsnap/delta"
)

// packCacheBytes bounds the memory held by whole cached packs: four
// full-size packs.
const packCacheBytes = 4 * packTarget

// packCache keeps whole packs that served more than one blob. Restores,
// branches and verifies read blobs in tree order, which is the order they
// were packed in, so one whole-pack read replaces hundreds of range reads
// (and of GETs, on a remote store). A pack read once stays a range read:
// a diff touching one file should not pull a 16 MiB pack. Packs are
// immutable, so a cached copy never goes stale; blobs read from it are
// still hash-checked. It is safe for concurrent use.
type packCache struct {
	mu    sync.Mutex
	seen  map[delta.ID]bool
	packs map[delta.ID][]byte
	order []delta.ID // insertion order, oldest first, for eviction
	bytes int
}

func newPackCache() *packCache {
	return &packCache{seen: map[delta.ID]bool{}, packs: map[delta.ID][]byte{}}
}

// get returns the cached pack, if any.
func (c *packCache) get(id delta.ID) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.packs[id]
	return p, ok
}

// wantWhole reports whether the pack has been read before and should now
// be fetched whole.
func (c *packCache) wantWhole(id delta.ID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen[id] {
		return true
	}
	c.seen[id] = true
	return false
}

func (c *packCache) put(id delta.ID, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(data) > packCacheBytes {
		return
	}
	for c.bytes+len(data) > packCacheBytes && len(c.order) > 0 {
		old := c.order[0]
		c.order = c.order[1:]
		c.bytes -= len(c.packs[old])
		delete(c.packs, old)
	}
	c.packs[id] = data
	c.order = append(c.order, id)
	c.bytes += len(data)
}
