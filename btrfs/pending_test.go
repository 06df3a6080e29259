package btrfs

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/roottest"
)

// treeLog records the trees a scan saves, and stores every blob in next.
type treeLog struct {
	next  delta.BlobSaver
	trees map[delta.ID]bool
}

func (l *treeLog) SaveBlob(ctx context.Context, t delta.BlobType, id delta.ID, data []byte) (bool, error) {
	if t == delta.BlobTree {
		l.trees[id] = true
	}
	return l.next.SaveBlob(ctx, t, id, data)
}

// TestPendingTreesAfterSkipAreReachable: a skip turn whose trees differ
// from the head's (a directory's mtime alone moved) leaves its directories
// pending, and the next scan saves their trees again. When that scan
// changes the root too, the skip's root tree is named by no checkpoint:
// saved, the store would count a reference to each of its children that no
// record holds (check.CountRefs: the engine's refcount recount). So every
// tree a scan saves must be reachable from the tree it returns.
func TestPendingTreesAfterSkipAreReachable(t *testing.T) {
	s := newSandbox(t, Options{})
	p := func(rel string) string { return filepath.Join(s.r.Path(), rel) }
	roottest.Write(t, p("work/a.txt"), "a\n")
	roottest.Write(t, p("work/deep/b.txt"), "b\n")
	roottest.Write(t, p("other/c.txt"), "c\n")
	head := s.checkpoint()
	// work/deep's mtime moves; nothing in it does: a skip the engine does
	// not commit.
	roottest.Write(t, p("work/deep/tmp"), "gone soon\n")
	must(t, os.Remove(p("work/deep/tmp")))
	skip, err := s.r.Scan(s.ctx, s.store)
	must(t, err)
	if skip.StateKey != head.StateKey || skip.Root == head.Root {
		t.Fatalf("the mtime-only turn: key %s (head %s), root %s (head %s); the test needs an equal key and another root",
			skip.StateKey.Short(), head.StateKey.Short(), skip.Root.Short(), head.Root.Short())
	}
	roottest.Write(t, p("other/c.txt"), "c, changed\n")
	log := &treeLog{next: s.store, trees: map[delta.ID]bool{}}
	next, err := s.r.Scan(s.ctx, log)
	must(t, err)
	reach := map[delta.ID]bool{}
	var walk func(id delta.ID)
	walk = func(id delta.ID) {
		reach[id] = true
		tr, err := delta.LoadTreeShallow(s.ctx, s.store, id)
		must(t, err)
		for _, e := range tr.Entries {
			if e.Type == delta.TypeDir {
				walk(e.Subtree)
			}
			if e.Indirect() {
				reach[e.ChunkList] = true
			}
		}
	}
	walk(next.Root)
	if !log.trees[next.Root] {
		t.Error("the changed root's tree was not saved")
	}
	for id := range log.trees {
		if !reach[id] {
			t.Errorf("the scan after the skip saved tree %s, which its root %s does not reach", id.Short(), next.Root.Short())
		}
	}
	// The pending directories the change left alone are still saved: the
	// store may lack them (the skip stored nothing).
	work := mustFind(t, s, next.Root, "work")
	if !log.trees[work] {
		t.Errorf("work's pending tree %s was not saved again", work.Short())
	}
	must(t, s.r.Committed(next))
}

func mustFind(t *testing.T, s *sandbox, root delta.ID, name string) delta.ID {
	t.Helper()
	tr, err := delta.LoadTreeShallow(s.ctx, s.store, root)
	must(t, err)
	e := tr.Find(name)
	if e == nil || e.Type != delta.TypeDir {
		t.Fatalf("tree %s has no directory %s", root.Short(), name)
	}
	return e.Subtree
}
