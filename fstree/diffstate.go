package fstree

import (
	"github.com/turnsnap/turnsnap/delta"
	"path"
	"slices"
)

// The state keys of a restored directory. Verify reads a kept directory
// whose children changed shallow (its names are listed, its children are
// checked one by one), so its scan cache entry has no state key, and the
// next tracked scan would list it again: a rollback after a rollback would
// pay for the directories the first one touched. The key follows from the
// target tree instead, as a scan computes it (scanner.dir): the target's
// entries with each subdirectory's mtime dropped and its subtree replaced
// by its state key, residue directories left out. A subdirectory's key
// comes from what Verify read (its changes come before its parent's), or,
// for one the diff left alone, from the live scan's cache, taken only when
// that entry names the same subtree under the same flags. Any key not
// known leaves its parent's unknown (zero): a scan then lists it.

// keptDir is a kept directory of the target whose children changed.
type keptDir struct {
	flags   dirFlags      // how a scan lists it
	entries []delta.Entry // the target's
	tree    delta.ID      // the target's tree of it
}

// StateKey returns the target's state key as Verify computed it; ok is
// false when some directory's key was not known.
func (p *DiffPlan) StateKey() (delta.ID, bool) { return p.stateKey, p.stateKey != delta.ID{} }

// noteState gives the fresh cache entry of kept directory rel (target
// entry e) its state key and subtree, once its children are verified.
func (p *DiffPlan) noteState(rel string, e *delta.Entry, fresh map[string]CacheEntry) {
	ce, ok := fresh[rel]
	if !ok {
		return
	}
	var key delta.ID
	if _, kept := p.kept[rel]; kept {
		if key, ok = p.stateOf(rel, fresh); !ok {
			return
		}
	} else {
		// Only its metadata changed: its subtree, and so its key, is the
		// live one's, unless its opaque flag (which its children's
		// residue depends on) changed.
		le, ok := p.opts.LiveCache.lookupDir(rel)
		if !ok || le.Entry.Subtree != e.Subtree || le.Entry.Opaque != e.Opaque || le.StateFlags != ce.StateFlags {
			return
		}
		key = le.State
	}
	ce.State, ce.Entry.Subtree = key, e.Subtree
	fresh[rel] = ce
}

// stateOf computes the state key of kept directory rel.
//
// A directory without subdirectories has a state tree equal to its tree
// (only subdirectory entries differ), so its state key is its tree's ID,
// provided the store named the tree under the scheme of opts.IDs (which a
// home's always does). That is checked on the first such directory, by
// hashing, and then trusted for the plan: a scheme that names one tree as
// another scheme does names every tree so.
func (p *DiffPlan) stateOf(rel string, fresh map[string]CacheEntry) (delta.ID, bool) {
	kd := p.kept[rel]
	cf := kd.flags
	if p.idsAgree == 1 && !slices.ContainsFunc(kd.entries, isDir) {
		return kd.tree, true
	}
	st := &delta.Tree{Entries: make([]delta.Entry, 0, len(kd.entries))}
	for _, e := range kd.entries {
		if e.Type == delta.TypeDir {
			crel := path.Join(rel, e.Name)
			key, ok := p.childState(crel, &e, cf, fresh)
			if !ok {
				return delta.ID{}, false
			}
			if !cf.merged && !cf.opaque && key == p.opts.IDs.EmptyTree() && p.opts.Residue != nil && p.opts.Residue(crel, &e) {
				continue
			}
			e.MtimeNs = 0
			e.Subtree = key
		}
		st.Entries = append(st.Entries, e)
	}
	st.MakeIndirect(p.opts.IDs) // canonical form; state trees are never stored
	key := p.opts.IDs.Hash(st.Encode())
	if p.idsAgree == 0 && len(st.Entries) == len(kd.entries) && !slices.ContainsFunc(kd.entries, isDir) {
		p.idsAgree = -1
		if key == kd.tree {
			p.idsAgree = 1
		}
	}
	return key, true
}

func isDir(e delta.Entry) bool { return e.Type == delta.TypeDir }

// childState is the state key of subdirectory crel (target entry e) of a
// directory listed with flags cf.
func (p *DiffPlan) childState(crel string, e *delta.Entry, cf dirFlags, fresh map[string]CacheEntry) (delta.ID, bool) {
	ce, ok := fresh[crel]
	if !ok {
		ce, ok = p.opts.LiveCache.Get(crel)
	}
	if !ok || ce.Entry.Type != delta.TypeDir || ce.Entry.Subtree != e.Subtree || ce.State == (delta.ID{}) || ce.StateFlags != cf.bits() {
		return delta.ID{}, false
	}
	return ce.State, true
}

// lookupDir returns the cache entry of directory rel if it has a state key.
func (c *ScanCache) lookupDir(rel string) (CacheEntry, bool) {
	ce, ok := c.Get(rel)
	return ce, ok && ce.Entry.Type == delta.TypeDir && ce.State != (delta.ID{})
}
