package catalog

import (
	"bytes"
	"encoding/json"
	"slices"
	"sync"

	"github.com/turnsnap/turnsnap/delta"
)

// recordCache keeps decoded checkpoint records by ID. A record is
// addressed by the hash of its bytes and never changes, yet decoding one
// (strict JSON, validation) costs far more than reading it: a daemon's
// retention pass reads the last records of every sandbox's line after
// each checkpoint. Tx.Checkpoint still reads the record's bytes in its own
// snapshot (so a deleted record is not found) and uses the cached decode
// only when they are the very bytes that were decoded and verified before;
// anything else is decoded, and verified against its ID, afresh.
type recordCache struct {
	mu      sync.Mutex
	entries map[delta.ID]cachedRecord
}

type cachedRecord struct {
	data []byte
	cp   *delta.Checkpoint
}

// recordCacheSize bounds the cache: a few hundred bytes per record, and
// what a retention pass reads (the newest records of each line) fits many
// times over.
const recordCacheSize = 4096

// get returns a copy of the decode of data cached for id, or nil.
func (c *recordCache) get(id delta.ID, data []byte) *delta.Checkpoint {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	e, ok := c.entries[id]
	c.mu.Unlock()
	if !ok || !bytes.Equal(e.data, data) {
		return nil
	}
	return cloneCheckpoint(e.cp)
}

// put caches cp, just decoded and verified from data.
func (c *recordCache) put(id delta.ID, data []byte, cp *delta.Checkpoint) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil || len(c.entries) >= recordCacheSize {
		// Dropping everything is crude but bounded, and the lines' newest
		// records come back at the next pass.
		c.entries = make(map[delta.ID]cachedRecord, 64)
	}
	c.entries[id] = cachedRecord{data: bytes.Clone(data), cp: cloneCheckpoint(cp)}
}

// cloneCheckpoint copies cp deeply enough that neither copy's caller can
// change the other (its pointer and slice fields are copied too).
func cloneCheckpoint(cp *delta.Checkpoint) *delta.Checkpoint {
	out := *cp
	if cp.ProcTree != nil {
		v := *cp.ProcTree
		out.ProcTree = &v
	}
	if cp.Conv != nil {
		v := *cp.Conv
		out.Conv = &v
	}
	if cp.Journal != nil {
		v := *cp.Journal
		out.Journal = &v
	}
	if cp.ProcDump != nil {
		v := *cp.ProcDump
		out.ProcDump = &v
	}
	if cp.Host != nil {
		out.Host = json.RawMessage(slices.Clone([]byte(cp.Host)))
	}
	return &out
}
