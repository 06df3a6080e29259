package fstree

import (
	"encoding/gob"
	"fmt"
	"github.com/turnsnap/turnsnap/delta"
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
	Entry delta.Entry // Name is empty: the map key holds the path
	// Racy marks entries stamped so close to their scan that a later change
	// might not have moved ctime; they are never trusted.
	Racy bool
	// State and StateFlags, for a directory, are its subtree's state key
	// and the dirFlags it was scanned with, so a tracked scan can take an
	// unchanged directory whole (scan_changed.go). A cache written before
	// they existed decodes with a zero State, which is never taken.
	State      delta.ID
	StateFlags uint8
}

// ScanCache maps root-relative paths to what they were at the last committed
// scan. It is a local accelerator, never part of a checkpoint: losing it
// costs one full read, nothing more.
//
// A cache is copy-on-write (layers.go): a tracked scan's cache holds only
// the entries it looked at and reads the rest through from the cache it
// was built on, which is never changed, so a turn or rollback a few files
// away costs what it looked at, not a copy of the whole map.
type ScanCache struct {
	Version int
	// entries are this cache's own entries; with under set, the paths it
	// has none for (and does not hide) are under's.
	entries map[string]CacheEntry
	// under, if set, is the flat cache this one was built on: shared,
	// read-only. hidden are under's paths this cache dropped.
	under  *ScanCache
	hidden map[string]bool
	// Links maps the later names of each hardlinked file to its first
	// name (which holds the content), and LinkNames lists every name of
	// such files, sorted: a tracked scan keeps their roles while no
	// changed path touches one (scan_changed.go). Walks ignore both.
	Links     map[string]string
	LinkNames []string
}

// NewScanCache returns an empty cache of the current version.
func NewScanCache() *ScanCache {
	return &ScanCache{Version: cacheVersion, entries: map[string]CacheEntry{}}
}

func (c *ScanCache) lookup(rel string, k CacheKey) (CacheEntry, bool) {
	e, ok := c.Get(rel)
	if !ok || e.Racy || e.Key != k {
		return CacheEntry{}, false
	}
	return e, true
}

// cacheFile is a cache as WriteCache stores it: the fields of the flat
// struct it replaced, so files written before the layers still read.
type cacheFile struct {
	Version   int
	Entries   map[string]CacheEntry
	Links     map[string]string
	LinkNames []string
}

// WriteCache serialises c.
func WriteCache(w io.Writer, c *ScanCache) error {
	return gob.NewEncoder(w).Encode(cacheFile{Version: c.Version, Entries: c.flat(), Links: c.Links, LinkNames: c.LinkNames})
}

// ReadCache parses a cache written by WriteCache. A cache of another version
// is ignored (nil, nil): it is only an accelerator.
func ReadCache(r io.Reader) (*ScanCache, error) {
	var f cacheFile
	if err := gob.NewDecoder(r).Decode(&f); err != nil {
		return nil, fmt.Errorf("scan cache: %w", err)
	}
	if f.Version != cacheVersion {
		return nil, nil
	}
	if f.Entries == nil {
		f.Entries = map[string]CacheEntry{}
	}
	return &ScanCache{Version: f.Version, entries: f.Entries, Links: f.Links, LinkNames: f.LinkNames}, nil
}
