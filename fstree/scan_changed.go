package fstree

import (
	"context"
	"errors"
	"fmt"
	"github.com/turnsnap/turnsnap/delta"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrMustWalk says a tracked scan met something the change set cannot
// vouch for (a multiply-linked file, whose other names may lie in
// directories it does not list): the caller runs the full walk instead.
var ErrMustWalk = errors.New("tracked scan cannot decide: walk")

// ChangeSet is the root-relative paths that may have changed since the scan
// that made a cache, as change events name them. A path stands for its
// entry and, for a directory, everything below it. Extra paths cost only a
// look; a missing one would hide a change, so the producer of a set must
// give up (and walk) whenever it may have missed one.
type ChangeSet struct {
	paths map[string]bool // named by an event
	along map[string]bool // a strict ancestor of a named path
}

// NewChangeSet returns the set of paths (cleaned; "" or "." is the root).
func NewChangeSet(paths []string) *ChangeSet {
	c := &ChangeSet{paths: map[string]bool{}, along: map[string]bool{}}
	for _, p := range paths {
		p = path.Clean("/" + p)[1:]
		c.paths[p] = true
		for d := p; d != ""; {
			i := strings.LastIndexByte(d, '/')
			if i < 0 {
				d = ""
			} else {
				d = d[:i]
			}
			if c.along[d] {
				break
			}
			c.along[d] = true
		}
	}
	return c
}

// Len is the number of named paths.
func (c *ChangeSet) Len() int { return len(c.paths) }

// touches reports whether rel or anything below it may have changed. A
// directory is below a named path when one of its ancestors is named.
func (c *ChangeSet) touches(rel string) bool {
	if c.paths[""] || c.paths[rel] || c.along[rel] {
		return true
	}
	for d := rel; ; {
		i := strings.LastIndexByte(d, '/')
		if i < 0 {
			return false
		}
		d = d[:i]
		if c.paths[d] {
			return true
		}
	}
}

// ScanChanged is Scan for a directory of which only the paths in changed
// may differ from what prev (the cache of the last committed scan, made by
// Scan or ScanChanged) recorded, counting changes from before that scan
// read anything (so that a change racing its reads is in changed). It lists the directories on the way to a
// changed path and stats their entries; a directory off those ways whose
// stat still matches prev is taken whole from prev, so the cost follows the
// change, not the tree. The result, Root and StateKey, equals a full
// Scan's. Its Cache is a new one (prev is not changed), which names trees
// as this scan saved them: it may be built on only once they are stored
// (the checkpoint holding the result is committed). opts.Prev and
// opts.Changed are set here. ErrMustWalk means: run Scan.
func ScanChanged(ctx context.Context, root string, prev *ScanCache, changed *ChangeSet, opts ScanOptions) (*ScanResult, error) {
	if prev == nil || changed == nil {
		return nil, fmt.Errorf("scan %s: no previous scan to build on: %w", root, ErrMustWalk)
	}
	if p, ok := prev.linkTouched(changed); ok {
		return nil, fmt.Errorf("scan %s: changed path %s holds or is a name of a hardlinked file: %w", root, p, ErrMustWalk)
	}
	opts.Prev, opts.Changed = prev, changed
	return Scan(ctx, root, opts)
}

// noteLink records that rel is a later name of the file first named
// primary.
func (c *ScanCache) noteLink(rel, primary string) {
	if c.Links == nil {
		c.Links = map[string]string{}
	}
	c.Links[rel] = primary
}

// indexLinks builds LinkNames from Links once a walk is done.
func (c *ScanCache) indexLinks() {
	c.LinkNames = nil
	for s, p := range c.Links {
		c.LinkNames = append(c.LinkNames, s, p)
	}
	slices.Sort(c.LinkNames)
	c.LinkNames = slices.Compact(c.LinkNames)
}

// isLinkName reports whether rel was a name of a hardlinked file.
func (c *ScanCache) isLinkName(rel string) bool {
	_, ok := slices.BinarySearch(c.LinkNames, rel)
	return ok
}

// linkTouched returns a changed path that is, or lies above, a name of a
// hardlinked file: a change there may move which name comes first.
func (c *ScanCache) linkTouched(changed *ChangeSet) (string, bool) {
	if len(c.LinkNames) == 0 {
		return "", false
	}
	for p := range changed.paths {
		if p == "" || c.isLinkName(p) {
			return p, true
		}
		i, _ := slices.BinarySearch(c.LinkNames, p+"/")
		if i < len(c.LinkNames) && strings.HasPrefix(c.LinkNames[i], p+"/") {
			return p, true
		}
	}
	return "", false
}

// lookupTracked lets a tracked scan trust a racy cache entry (one stamped
// within RacyWindow of the scan that made it) off the changed paths. The
// racy rule guards against a change in the same clock tick as that scan's
// read, which leaves ctime as it was; but the change record the cache is
// the base of starts before that read, so any such change is a changed
// path now. On the changed paths the usual rule stands.
func (s *scanner) lookupTracked(rel string, k CacheKey, prev CacheEntry, hit bool) (CacheEntry, bool) {
	if hit || s.opts.Changed.touches(rel) {
		return prev, hit
	}
	e, ok := s.opts.Prev.Get(rel)
	if !ok || e.Key != k {
		return CacheEntry{}, false
	}
	return e, true
}

// bits packs the flags a directory's state key depends on.
func (fl dirFlags) bits() uint8 {
	var b uint8
	if fl.merged {
		b |= 1
	}
	if fl.opaque {
		b |= 2
	}
	return b | 4 // never zero: a zero StateFlags is "unknown"
}

// reuse is the tracked scan's shortcut for entry rel (stat st): an
// unchanged directory comes whole from Prev. ok=false: scan the entry.
func (s *scanner) reuse(dirFD int, rel, name string, st *unix.Stat_t, prev CacheEntry, hit bool, fl dirFlags) (delta.Entry, delta.ID, bool, error) {
	if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink > 1 {
		n := uint64(st.Nlink)
		if s.opts.TreeLinks != nil && !fl.merged {
			var err error
			if n, err = s.opts.TreeLinks(dirFD, name, rel, st); err != nil {
				return delta.Entry{}, delta.ID{}, false, fmt.Errorf("scan %s: %w", s.where(rel), err)
			}
		}
		if n > 1 {
			// A name of a hardlinked file no changed path touches keeps
			// the role it had (ScanChanged walks for any that is
			// touched): a later name points at the same first name, the
			// first name is read as any file is.
			if fl.merged || s.opts.Changed.touches(rel) || !s.opts.Prev.isLinkName(rel) {
				return delta.Entry{}, delta.ID{}, false, fmt.Errorf("scan %s: multiply-linked file: %w", s.where(rel), ErrMustWalk)
			}
			if primary, ok := s.opts.Prev.Links[rel]; ok {
				return delta.Entry{Name: name, Type: delta.TypeHardlink, Target: primary}, delta.ID{}, true, nil
			}
			if !hit {
				return delta.Entry{}, delta.ID{}, false, fmt.Errorf("scan %s: hardlinked file changed: %w", s.where(rel), ErrMustWalk)
			}
		}
	}
	if !hit || fl.merged || prev.Entry.Type != delta.TypeDir || prev.State == (delta.ID{}) ||
		prev.StateFlags != fl.bits() || s.opts.Changed.touches(rel) {
		return delta.Entry{}, delta.ID{}, false, nil
	}
	e := prev.Entry
	e.Name = name
	s.next.Put(rel, prev)
	return e, prev.State, true, nil
}
