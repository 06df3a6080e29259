package overlay

import (
	"sync"

	"github.com/turnsnap/turnsnap/fstree"
	"golang.org/x/sys/unix"
)

// cacheMemo keeps the scan caches a Backend's roots last read or wrote,
// decoded, so a long-lived engine (the daemon) does not decode a
// 2,000-entry cache from disk on every turn and rollback (milliseconds of
// gob each time). An entry is used only while the cache file is the very
// file it was taken from (same inode, size, mtime and ctime): a cache
// written by another process is a new file (writeCacheFile renames one
// into place) and is read again. Safe for concurrent use; callers never
// modify a cache they got from it.
type cacheMemo struct {
	mu sync.Mutex
	m  map[string]memoEntry
}

// memoMax bounds the caches kept: one per live sandbox layer is enough,
// and a layer replaced by a rebuild leaves its entry behind.
const memoMax = 256

type memoEntry struct {
	key fstree.CacheKey
	c   *fstree.ScanCache
}

func newCacheMemo() *cacheMemo { return &cacheMemo{m: map[string]memoEntry{}} }

func fileKey(p string) (fstree.CacheKey, bool) {
	var st unix.Stat_t
	if unix.Stat(p, &st) != nil {
		return fstree.CacheKey{}, false
	}
	return fstree.CacheKey{Dev: st.Dev, Ino: st.Ino, Size: st.Size, Mode: st.Mode,
		MtimeNs: unix.TimespecToNsec(st.Mtim), CtimeNs: unix.TimespecToNsec(st.Ctim)}, true
}

// read returns the cache in file p, from the memo while p is unchanged.
func (m *cacheMemo) read(p string) *fstree.ScanCache {
	if m == nil {
		return readCache(p)
	}
	k, ok := fileKey(p)
	if !ok {
		return nil
	}
	m.mu.Lock()
	e, hit := m.m[p]
	m.mu.Unlock()
	if hit && e.key == k {
		return e.c
	}
	c := readCache(p)
	if c != nil {
		m.put(p, k, c)
	}
	return c
}

// wrote records c as the content of file p, just written.
func (m *cacheMemo) wrote(p string, c *fstree.ScanCache) {
	if m == nil {
		return
	}
	if k, ok := fileKey(p); ok {
		m.put(p, k, c)
	}
}

func (m *cacheMemo) put(p string, k fstree.CacheKey, c *fstree.ScanCache) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.m[p]; !ok && len(m.m) >= memoMax {
		for old := range m.m {
			delete(m.m, old)
			break
		}
	}
	m.m[p] = memoEntry{key: k, c: c}
}
