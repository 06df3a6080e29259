package fstree

import (
	"context"
	"errors"
	"fmt"
	"github.com/turnsnap/turnsnap/delta"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// buildFlat makes dirs d0..d3 of files only (and one with a subdirectory).
func buildFlat(t *testing.T, dir string) {
	t.Helper()
	for d := range 4 {
		for f := range 30 {
			p := filepath.Join(dir, fmt.Sprintf("d%d/f%02d", d, f))
			must(t, os.MkdirAll(filepath.Dir(p), 0o755))
			must(t, os.WriteFile(p, []byte(p), 0o644))
		}
	}
	must(t, os.MkdirAll(filepath.Join(dir, "d3/sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "d3/sub/x"), []byte("x"), 0o644))
}

// editFlat changes a file in each directory, adds one and removes one.
func editFlat(t *testing.T, dir string) {
	t.Helper()
	for d := range 4 {
		must(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("d%d/f03", d)), []byte("edited"), 0o644))
	}
	must(t, os.WriteFile(filepath.Join(dir, "d1/new"), []byte("new"), 0o600))
	must(t, os.Remove(filepath.Join(dir, "d2/f07")))
	must(t, os.WriteFile(filepath.Join(dir, "d3/sub/x"), []byte("y"), 0o644))
}

// A diff's Verify lists every directory whose children it changed: a name
// the target lacks (say, one a stale change record hid from the live
// scan) or a name gone missing is refused, naming the directory.
func TestVerifyRefusesStrayAndMissingNames(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	mem := newMem()
	for _, tc := range []struct {
		name  string
		spoil func(dir string) error
		want  string
	}{
		{"a stray name", func(dir string) error { return os.WriteFile(filepath.Join(dir, "d1/stray"), nil, 0o644) }, `"stray" not among them`},
		{"a missing name", func(dir string) error { return os.Remove(filepath.Join(dir, "d1/f10")) }, "holds 29 names, the target 30"},
	} {
		dir := t.TempDir()
		buildFlat(t, dir)
		a, err := Scan(ctx, dir, ScanOptions{Saver: mem})
		must(t, err)
		editFlat(t, dir)
		b, err := Scan(ctx, dir, ScanOptions{Saver: mem})
		must(t, err)
		plan, err := PlanDiff(ctx, dir, b.Root, a.Root, DiffOptions{Loader: mem, Live: mem})
		must(t, err)
		res, err := plan.Apply(ctx)
		must(t, err)
		must(t, tc.spoil(dir))
		_, err = plan.Verify(ctx, res)
		if !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), "/d1: ") || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: Verify says %v, want ErrCorrupt naming /d1 and %q", tc.name, err, tc.want)
		}
	}
}

// countingMemo is a TreeMemo that records what it kept, and a loader
// counting the trees it served.
type countingMemo struct {
	next  delta.BlobLoader
	mu    sync.Mutex
	kept  map[delta.ID]*delta.Tree
	enc   map[delta.ID]string // each kept tree's encoding when kept
	loads int
}

func (m *countingMemo) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	if t == delta.BlobTree {
		m.mu.Lock()
		m.loads++
		m.mu.Unlock()
	}
	return m.next.LoadBlob(ctx, t, id)
}

func (m *countingMemo) MemoTree(id delta.ID) (*delta.Tree, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.kept[id]
	return t, ok
}

func (m *countingMemo) KeepTree(id delta.ID, t *delta.Tree, size int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if enc := t.Encode(); len(enc) != size || delta.Hash(enc) != id {
		panic(fmt.Sprintf("kept tree %s does not encode as its %d bytes", id.Short(), size))
	}
	m.kept[id], m.enc[id] = t, string(t.Encode())
}

// Plans through a loader that keeps decoded trees take the trees of both
// states from it once they were loaded (a rollback loop between two states
// loads no tree after its first two rounds), still land on the target,
// with its state key, and leave the shared trees as they were.
func TestPlanDiffTreeMemo(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	dir := t.TempDir()
	mem := newMem()
	buildFlat(t, dir)
	a, err := Scan(ctx, dir, ScanOptions{Saver: mem})
	must(t, err)
	editFlat(t, dir)
	b, err := Scan(ctx, dir, ScanOptions{Saver: mem})
	must(t, err)
	memo := &countingMemo{next: mem, kept: map[delta.ID]*delta.Tree{}, enc: map[delta.ID]string{}}
	live := b
	for round, to := range []*ScanResult{a, b, a, b} {
		before := memo.loads
		// The live loader is the scan's own (as overlay's memTrees): it
		// is never a memo, but the plan looks its trees up in the target's.
		// From round 2 on both states passed CheckState before, as the
		// engine's memo of checks records.
		cl := NewCheckedLoader(memo)
		if round >= 2 {
			cl.Checked(to.Root, delta.StateRules{})
		}
		plan, err := PlanDiff(ctx, dir, live.Root, to.Root, DiffOptions{Loader: cl, Live: mem, LiveCache: live.Cache})
		must(t, err)
		res, err := plan.Apply(ctx)
		must(t, err)
		fresh, err := plan.Verify(ctx, res)
		must(t, err)
		must(t, plan.Sync(res, fresh))
		now, err := Scan(ctx, dir, ScanOptions{Saver: mem})
		must(t, err)
		if now.Root != to.Root {
			t.Fatalf("round %d: the directory hashes to %s, want %s", round, now.Root.Short(), to.Root.Short())
		}
		if key, ok := plan.StateKey(); !ok || key != now.StateKey {
			t.Fatalf("round %d: Verify's state key %s (known: %v), a scan's %s", round, key.Short(), ok, now.StateKey.Short())
		}
		if loads := memo.loads - before; round >= 2 && loads != 0 {
			t.Fatalf("round %d: %d trees loaded, all of them were decoded before", round, loads)
		} else if round < 2 && loads == 0 {
			t.Fatalf("round %d: no tree loaded: the test proves nothing", round)
		}
		live = now
	}
	for id, tr := range memo.kept {
		if string(tr.Encode()) != memo.enc[id] {
			t.Fatalf("kept tree %s was changed by a plan", id.Short())
		}
	}
}
