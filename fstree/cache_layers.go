package fstree

import (
	"maps"
	"strings"
)

// A tracked scan (ScanChanged) looks at a few directories and takes the
// rest of its cache from the last committed one. Copying that cache (2,000
// entries for a 2,000-file layer) cost more than the scan itself, on every
// turn and rollback, so a tracked scan's cache is a layer instead: its own
// entries over the cache it was built on, read through. The cache below is
// flat (never a layer itself) and never changed once it is below one: it
// is some committed scan's cache, which the memo, the tracker or the cache
// file may still hand out, so a layer over a layer copies the lower one's
// own entries into its own. A layer whose own entries grow past an eighth
// of the cache below is flattened: a lookup is at most two map reads, a
// merge copies at most an eighth of the cache, and a flatten (a copy of
// the cache) comes only after the scans have looked at an eighth of it
// anew, so the copies are paid for by what the scans looked at.

// Get returns the entry of rel, if the cache has one (a nil cache has none).
func (c *ScanCache) Get(rel string) (CacheEntry, bool) {
	if c == nil {
		return CacheEntry{}, false
	}
	if e, ok := c.entries[rel]; ok {
		return e, true
	}
	if c.under == nil || c.hidden[rel] {
		return CacheEntry{}, false
	}
	e, ok := c.under.entries[rel]
	return e, ok
}

// Put sets the entry of rel. Only the cache's owner may call it (the scan
// that made it, or the restore that patches the cache its scan made): the
// caches below are shared and never changed.
func (c *ScanCache) Put(rel string, e CacheEntry) {
	if c.entries == nil {
		c.entries = map[string]CacheEntry{}
	}
	c.entries[rel] = e
}

// Delete drops the entry of rel, if any.
func (c *ScanCache) Delete(rel string) {
	delete(c.entries, rel)
	if c.under != nil {
		if _, ok := c.under.entries[rel]; ok {
			c.hide(rel)
		}
	}
}

// DeleteBelow drops the entries of every path below directory dir (not
// dir's own).
func (c *ScanCache) DeleteBelow(dir string) {
	prefix := dir + "/"
	if dir == "" {
		prefix = ""
	}
	for k := range c.entries {
		if strings.HasPrefix(k, prefix) && k != dir {
			delete(c.entries, k)
		}
	}
	if c.under == nil {
		return
	}
	for k := range c.under.entries {
		if strings.HasPrefix(k, prefix) && k != dir {
			c.hide(k)
		}
	}
}

func (c *ScanCache) hide(rel string) {
	if c.hidden == nil {
		c.hidden = map[string]bool{}
	}
	c.hidden[rel] = true
}

// Len is the number of entries the cache holds (for a layer, a count over
// both).
func (c *ScanCache) Len() int {
	if c == nil {
		return 0
	}
	if c.under == nil {
		return len(c.entries)
	}
	n := len(c.entries)
	for k := range c.under.entries {
		if _, own := c.entries[k]; !own && !c.hidden[k] {
			n++
		}
	}
	return n
}

// flat returns every entry in one map: the cache's own for a flat cache
// (not to be changed), a new one for a layer.
func (c *ScanCache) flat() map[string]CacheEntry {
	if c.under == nil {
		return c.entries
	}
	out := make(map[string]CacheEntry, len(c.under.entries)+len(c.entries))
	for k, e := range c.under.entries {
		if !c.hidden[k] {
			out[k] = e
		}
	}
	maps.Copy(out, c.entries)
	return out
}

// merge returns c with the entries of a tracked scan (next, which the
// scan hands over: its map becomes the result's) laid over it; c itself is
// left as it was, since a turn that is not committed (a skip, a failure)
// must leave its base untouched: the trees its scan named were never
// stored. Entries of paths that are gone stay behind; a cache is looked up
// only along existing paths, by inode and ctime, so they are never taken,
// and the next full walk drops them.
func (c *ScanCache) merge(next *ScanCache) *ScanCache {
	out := &ScanCache{Version: c.Version, entries: next.entries, Links: c.Links, LinkNames: c.LinkNames}
	if c.under == nil {
		out.under = c
		return out.settle()
	}
	out.under = c.under
	for k, e := range c.entries {
		if _, ok := out.entries[k]; !ok {
			out.entries[k] = e
		}
	}
	for k := range c.hidden {
		if _, ok := out.entries[k]; !ok {
			out.hide(k)
		}
	}
	return out.settle()
}

// settle flattens a layer whose own entries outgrew an eighth of the
// cache below it, by copying that cache's entries into its own map (which it
// owns): a copy no larger than eight times what its scans looked at.
func (c *ScanCache) settle() *ScanCache {
	if c.under == nil || 8*len(c.entries) <= len(c.under.entries) {
		return c
	}
	for k, e := range c.under.entries {
		if _, own := c.entries[k]; !own && !c.hidden[k] {
			c.entries[k] = e
		}
	}
	c.under, c.hidden = nil, nil
	return c
}
