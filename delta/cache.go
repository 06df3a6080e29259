package delta

import (
	"encoding/gob"
	"fmt"
	"io"

	"golang.org/x/sys/unix"
)

// Version 2 added Dev: a directory listed through a merged view (overlay's
// redirects) has other device numbers than the upper.
const cacheVersion = 2

// CacheKey is what must be unchanged for a file's content to be trusted
// without reading it. ctime is the heart of it: user space cannot set it, and
// every content, mode, owner, xattr or link-count change moves it.
type CacheKey struct {
	Dev     uint64
	Ino     uint64
	Size    int64
	MtimeNs int64
	CtimeNs int64
	Mode    uint32 // full st_mode, type bits included
}

func cacheKeyOf(st *unix.Stat_t) CacheKey {
	return CacheKey{
		Dev: st.Dev, Ino: st.Ino, Size: st.Size, Mode: st.Mode,
		MtimeNs: unix.TimespecToNsec(st.Mtim), CtimeNs: unix.TimespecToNsec(st.Ctim),
	}
}

// CacheEntry is one remembered path.
type CacheEntry struct {
	Key   CacheKey
	Entry Entry // Name is empty: the map key holds the path
	// Racy marks entries stamped so close to their scan that a later change
	// might not have moved ctime; they are never trusted.
	Racy bool
	// State and StateFlags, for a directory, are its subtree's state key
	// and the dirFlags it was scanned with, so a tracked scan can take an
	// unchanged directory whole (scan_changed.go). A cache written before
	// they existed decodes with a zero State, which is never taken.
	State      ID
	StateFlags uint8
}

// ScanCache maps root-relative paths to what they were at the last committed
// scan. It is a local accelerator, never part of a checkpoint: losing it
// costs one full read, nothing more.
type ScanCache struct {
	Version int
	Entries map[string]CacheEntry
	// Links maps the later names of each hardlinked file to its first
	// name (which holds the content), and LinkNames lists every name of
	// such files, sorted: a tracked scan keeps their roles while no
	// changed path touches one (scan_changed.go). Walks ignore both.
	Links     map[string]string
	LinkNames []string
}

func (c *ScanCache) lookup(rel string, k CacheKey) (CacheEntry, bool) {
	if c == nil {
		return CacheEntry{}, false
	}
	e, ok := c.Entries[rel]
	if !ok || e.Racy || e.Key != k {
		return CacheEntry{}, false
	}
	return e, true
}

// WriteCache serialises c.
func WriteCache(w io.Writer, c *ScanCache) error {
	return gob.NewEncoder(w).Encode(c)
}

// ReadCache parses a cache written by WriteCache. A cache of another version
// is ignored (nil, nil): it is only an accelerator.
func ReadCache(r io.Reader) (*ScanCache, error) {
	var c ScanCache
	if err := gob.NewDecoder(r).Decode(&c); err != nil {
		return nil, fmt.Errorf("scan cache: %w", err)
	}
	if c.Version != cacheVersion {
		return nil, nil
	}
	return &c, nil
}
