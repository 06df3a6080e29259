package engine

import (
	"cmp"
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/statememo"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"github.com/turnsnap/turnsnap/overlay"
	"golang.org/x/sys/unix"
)

// checkRolledBack checks sandbox name's root after a rollback to cp
// against a fresh, cacheless walk of its layer (the state key and tree
// must be cp's) and against the merged view recorded when cp was taken.
func checkRolledBack(t *testing.T, e *Engine, name string, cp *delta.Checkpoint, merged delta.ID, what string) {
	t.Helper()
	ctx := context.Background()
	st, err := e.loadSandbox(ctx, delta.SandboxName(name))
	must(t, err)
	full, err := st.root.(*overlay.Root).ScanFull(ctx)
	must(t, err)
	// A layer that holds copies of base files a rollback wrote back
	// through the mount (fstree's diffbase.go) walks as another tree with
	// the same merged state.
	same := full.Root == cp.FSTree && full.StateKey == cp.StateKey
	if !same {
		trees := statememo.NewTrees(e.data.repo)
		res, err := st.root.Scan(ctx, trees)
		must(t, err)
		if res.Root != full.Root {
			t.Fatalf("%s: the layer walks as tree %s without its cache, %s with it", what, full.Root.Short(), res.Root.Short())
		}
		changed, err := delta.Changed(ctx, trees, delta.Layers{cp.BaseTree, cp.FSTree}, delta.Layers{cp.BaseTree, res.Root})
		must(t, err)
		same = !changed
	}
	if !same {
		t.Fatalf("%s: the layer walks as tree %s state %s, the checkpoint %s has %s/%s",
			what, full.Root.Short(), full.StateKey.Short(), cp.ID.Short(), cp.FSTree.Short(), cp.StateKey.Short())
	}
	if got := mergedState(t, st.root.Path()); got != merged {
		t.Fatalf("%s: the root hashes to %s, it did to %s when %s was taken", what, got.Short(), merged.Short(), cp.ID.Short())
	}
}

// A tracked rollback is a rollback: after random turns (renames of files
// and of base directories, deletes, new directories, chmod, xattrs,
// hardlinks, symlinks, copy-ups) and uncommitted edits on top, a rollback
// through the change tracker leaves exactly the target's layer (a fresh
// walk says so) and the merged view the target had, and the turn after
// it, tracked by the restored root's new tracker, equals a full read.
//
// The same turns run without tracking too (rollbacks that walk): both
// must pass the same checks.
//
// In the agent-only variants every random edit is below a directory the
// base lacks, so most rollbacks write their diff through the mounted root
// (fstree.DiffPlan.Mountable) and keep it mounted; they must pass the same
// checks, and the opening rollback below a renamed base directory must
// not take that path.
func TestTrackedRollbackEqualsWalk(t *testing.T) {
	t.Run("tracked", func(t *testing.T) { rollbackDifferential(t, true, "") })
	t.Run("walk", func(t *testing.T) { rollbackDifferential(t, false, "") })
	t.Run("tracked/agent-only", func(t *testing.T) { rollbackDifferential(t, true, "agent") })
	t.Run("walk/agent-only", func(t *testing.T) { rollbackDifferential(t, false, "agent") })
}

// rollbackDifferential runs the random turns and rollbacks; area, if set,
// is the directory (absent from the base) the random edits stay below.
func rollbackDifferential(t *testing.T, tracked bool, area string) {
	ctx := context.Background()
	e := newEngine(t)
	if tracked {
		e = openTracking(t, filepath.Join(t.TempDir(), "home"))
	}
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	root := cr.Root
	type point struct {
		cp     *delta.Checkpoint
		merged delta.ID
	}
	var history []point
	take := func(what string) {
		t.Helper()
		merged := mergedState(t, root)
		res, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
		must(t, err)
		checkAgainstFullRead(t, e, "s", res, what)
		cp, err := e.Resolve(ctx, mustRef(res.ID.String()))
		must(t, err)
		history = append(history, point{cp, merged})
	}
	lives := map[string]int{}
	mounted := 0
	rollback := func(to point, what string) *RestoreResult {
		t.Helper()
		res, err := e.Rollback(ctx, "s", mustRef(to.cp.ID.String()), RollbackOptions{})
		must(t, err)
		lives[res.LiveScan]++
		if res.Mounted {
			mounted++
		}
		checkRolledBack(t, e, "s", to.cp, to.merged, what)
		return res
	}

	// A renamed base directory is listed through the mount, and its tree
	// is marked opaque, which its upper is not: a tracked rollback that
	// would change below it must rebuild (overlay's KeptDir check), not
	// write a diff planned from the merged listing into the upper.
	take("start")
	roottest.Move(t, filepath.Join(root, "deep/a"), filepath.Join(root, "moved"))
	take("base directory renamed")
	must(t, os.Remove(filepath.Join(root, "moved/b/c/file"))) // a base file: a whiteout in the redirected upper
	write(t, filepath.Join(root, "moved/b/new"), "new\n")
	if res := rollback(history[1], "rollback below a renamed base directory"); res.Mounted {
		t.Fatal("a rollback that brings back a base file wrote through the mount")
	}
	write(t, filepath.Join(root, "src/x"), "x\n")
	take("turn after the rollback")
	edits, since := root, 0
	if area != "" {
		edits = filepath.Join(root, area)
		must(t, os.MkdirAll(filepath.Join(edits, "d"), 0o755))
		write(t, filepath.Join(edits, "d", "f"), "agent's\n")
		take("the agent's directory")
		since = len(history) - 1 // rollbacks keep the directory
	}

	rounds := 30
	if testing.Short() {
		rounds = 10
	}
	rng := rand.New(rand.NewSource(13))
	for round := range rounds {
		for range 1 + rng.Intn(5) {
			trackedEdit(t, rng, edits)
		}
		if rng.Intn(3) > 0 {
			take(fmt.Sprint("round ", round))
		}
		// Uncommitted edits, which the rollback drops: at least one in
		// place (content, mode or xattr of a file that stays put), which
		// only the change record names, since no directory's stat moves.
		inPlaceEdit(t, rng, edits)
		for range rng.Intn(3) {
			trackedEdit(t, rng, edits)
		}
		if rng.Intn(2) == 0 {
			to := history[since+rng.Intn(len(history)-since)]
			rollback(to, fmt.Sprintf("round %d: rollback to %s", round, to.cp.ID.Short()))
		}
	}
	t.Logf("live states found: %v; %d of the rollbacks wrote through the mount", lives, mounted)
	if tracked && lives[overlay.LiveTracked] < 3 {
		t.Fatalf("only %d of the rollbacks were tracked (%v): the differential proves nothing", lives[overlay.LiveTracked], lives)
	}
	if area != "" && mounted < 3 {
		t.Fatalf("only %d of the rollbacks wrote through the mount: the variant proves nothing", mounted)
	}
}

// inPlaceEdit rewrites, chmods or sets an xattr on a random file below
// root at least one directory deep.
func inPlaceEdit(t *testing.T, rng *rand.Rand, root string) {
	t.Helper()
	var files []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if rel, _ := filepath.Rel(root, p); err == nil && d.Type().IsRegular() && strings.Contains(rel, "/") {
			files = append(files, p)
		}
		return nil
	})
	if len(files) == 0 {
		return
	}
	f := files[rng.Intn(len(files))]
	switch rng.Intn(3) {
	case 0:
		fh, err := os.OpenFile(f, os.O_WRONLY, 0)
		must(t, err)
		_, err = fh.WriteAt([]byte(fmt.Sprint("in place ", rng.Int())), 0)
		must(t, err)
		must(t, fh.Close())
	case 1:
		must(t, os.Chmod(f, 0o600|os.FileMode(rng.Intn(0o100))))
	case 2:
		must(t, unix.Setxattr(f, "user.k", []byte(fmt.Sprint("v", rng.Int())), 0))
	}
}

// trackedEdit makes one random change below root, of a kind a tracked
// rollback must see.
func trackedEdit(t *testing.T, rng *rand.Rand, root string) {
	t.Helper()
	dirs, files := roottest.Tree(root)
	pick := func(l []string) string { return roottest.Pick(rng, l) }
	p := func(rel string) string { return filepath.Join(root, rel) }
	name := fmt.Sprintf("n%d", rng.Intn(1000))
	into := pick(append(slices.Clone(dirs), ""))
	target := filepath.Join(into, name)
	if _, err := os.Lstat(p(target)); err == nil {
		return
	}
	switch rng.Intn(13) {
	case 0: // rename a directory (a base one becomes a redirect)
		d := pick(dirs)
		if d == "" || into == d || strings.HasPrefix(into, d+"/") {
			return
		}
		must(t, os.Rename(p(d), p(target)))
	case 1:
		if fl := pick(files); fl != "" {
			must(t, os.Rename(p(fl), p(target)))
		}
	case 2, 3:
		write(t, p(target), strings.Repeat("x", rng.Intn(5000)))
	case 4: // rewrite in place (a copy-up of a base file)
		if fl := pick(files); fl != "" {
			must(t, os.WriteFile(p(fl), []byte(fmt.Sprint("rewritten ", rng.Int())), 0o644))
		}
	case 5:
		if fl := pick(files); fl != "" {
			must(t, os.Remove(p(fl)))
		}
	case 6:
		if d := pick(dirs); d != "" {
			must(t, os.RemoveAll(p(d)))
		}
	case 7:
		must(t, os.MkdirAll(p(filepath.Join(target, "sub")), 0o755))
		write(t, p(filepath.Join(target, "sub", "f")), "in a new dir\n")
	case 8:
		if fl := pick(files); fl != "" {
			must(t, os.Chmod(p(fl), 0o600|os.FileMode(rng.Intn(0o100))))
		} else if d := pick(dirs); d != "" {
			must(t, os.Chmod(p(d), 0o700|os.FileMode(rng.Intn(0o100))))
		}
	case 9:
		if fl := pick(files); fl != "" {
			must(t, unix.Setxattr(p(fl), "user.k", []byte(fmt.Sprint(rng.Intn(3))), 0))
		}
	case 10:
		if fl := pick(files); fl != "" {
			unix.Removexattr(p(fl), "user.k") // ENODATA when it has none
		}
	case 11: // rarely: a hardlink makes the tracked scans walk near it
		if fl := pick(files); fl != "" && rng.Intn(3) == 0 {
			must(t, os.Link(p(fl), p(target)))
		}
	case 12:
		must(t, os.Symlink(cmp.Or(pick(files), "nowhere"), p(target)))
	}
}

// A copied-up base file rewritten in place by a rollback and then deleted
// through the mount (its directory removed) leaves an orphan index entry:
// a link to an inode no upper name holds. The next mount made it a
// whiteout index, and a rollback that brought the base file's name back
// read it as EIO. Both rollback paths, tracked and not, must bring the
// base file back readable (overlay's dropWhiteoutIndex drops orphans).
func TestRollbackBringsBackADeletedCopiedUpBaseFile(t *testing.T) {
	for _, tracked := range []bool{true, false} {
		t.Run(fmt.Sprint("tracked=", tracked), func(t *testing.T) {
			ctx := context.Background()
			e, cr := richSandbox(t, tracked)
			p := func(rel string) string { return filepath.Join(cr.Root, rel) }
			take := func() *delta.Checkpoint {
				t.Helper()
				res, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
				must(t, err)
				cp, err := e.Resolve(ctx, mustRef(res.ID.String()))
				must(t, err)
				return cp
			}
			write(t, p("src/other"), "a turn\n")
			c0 := take()
			write(t, p("etc/config"), "port=2\n") // copied up: indexed
			c1 := take()
			write(t, p("etc/config"), "port=3\n")
			take()
			_, err := e.Rollback(ctx, "s", mustRef(c1.ID.String()), RollbackOptions{}) // rewrites it in place
			must(t, err)
			must(t, os.RemoveAll(p("etc")))
			_, err = e.Rollback(ctx, "s", mustRef(c0.ID.String()), RollbackOptions{})
			must(t, err)
			if got, err := os.ReadFile(p("etc/config")); err != nil || string(got) != "port=1\n" {
				t.Fatalf("the base file after the rollback: %q, %v", got, err)
			}
			st, err := e.loadSandbox(ctx, "s")
			must(t, err)
			full, err := st.root.(*overlay.Root).ScanFull(ctx)
			must(t, err)
			if full.Root != c0.FSTree {
				t.Fatalf("the layer walks as %s, the checkpoint has %s", full.Root.Short(), c0.FSTree.Short())
			}
		})
	}
}

// Rollbacks in a row, with edits between them and no checkpoint, are all
// tracked: each restored root's tracker gets the restored state as its
// base (with the state keys of the directories the diff changed, so the
// next live scan does not list them), and the turn after them is tracked
// and equals a full read.
func TestTrackedRollbackAfterRollback(t *testing.T) {
	ctx := context.Background()
	e := openTracking(t, filepath.Join(t.TempDir(), "home"))
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	p := func(rel string) string { return filepath.Join(cr.Root, rel) }
	for i := range 40 {
		write(t, p(fmt.Sprintf("w%d/f%02d", i%4, i)), fmt.Sprint("one ", i))
	}
	take := func() point2 { t.Helper(); return takePoint(t, e, cr.Root) }
	c1 := take()
	write(t, p("w0/f00"), "two")
	write(t, p("w1/new"), "two")
	must(t, os.Remove(p("w2/f02")))
	must(t, os.Chmod(p("w3"), 0o700))
	c2 := take()
	for i, to := range []point2{c1, c2, c1, c2, c1} {
		write(t, p(fmt.Sprintf("w%d/f%02d", i%4, 10+i)), "uncommitted")
		res, err := e.Rollback(ctx, "s", mustRef(to.cp.ID.String()), RollbackOptions{})
		must(t, err)
		if res.LiveScan != overlay.LiveTracked {
			t.Fatalf("rollback %d found the live state by %q, want it tracked", i, res.LiveScan)
		}
		checkRolledBack(t, e, "s", to.cp, to.merged, fmt.Sprint("rollback ", i))
	}
	write(t, p("w2/after"), "after")
	res, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	checkAgainstFullRead(t, e, "s", res, "turn after the rollbacks")
	if res.Stats.Entries > 20 {
		t.Fatalf("the turn after the rollbacks looked at %d entries: the restored directories were listed again", res.Stats.Entries)
	}
}

type point2 struct {
	cp     *delta.Checkpoint
	merged delta.ID
}

// takePoint checkpoints sandbox s (root at root) and returns the
// checkpoint with the merged state it was taken of.
func takePoint(t *testing.T, e *Engine, root string) point2 {
	t.Helper()
	merged := mergedState(t, root)
	res, err := e.Checkpoint(context.Background(), "s", CheckpointOptions{})
	must(t, err)
	cp, err := e.Resolve(context.Background(), mustRef(res.ID.String()))
	must(t, err)
	return point2{cp, merged}
}

// TestMountedRollbackRemovesARenamedBaseFile: a base file renamed by the
// agent is a copy-up at a name the base lacks (overlay indexes it by its
// base inode), so a rollback that only drops it writes through the mount,
// and overlay's own unlink leaves a whiteout index for the base inode. The
// rollback after it, which brings the base name back, writes the base's
// file back through the mount (a new upper file, fstree's diffbase.go)
// and must read the base file, not EIO; every state walks as its
// checkpoint (or as the same merged state) and hashes as it did when
// taken.
func TestMountedRollbackRemovesARenamedBaseFile(t *testing.T) {
	for _, tracked := range []bool{true, false} {
		t.Run(fmt.Sprint("tracked=", tracked), func(t *testing.T) {
			ctx := context.Background()
			e, cr := richSandbox(t, tracked)
			p := func(rel string) string { return filepath.Join(cr.Root, rel) }
			take := func() point2 { t.Helper(); return takePoint(t, e, cr.Root) }
			rollback := func(to point2, mounted bool, what string) {
				t.Helper()
				res, err := e.Rollback(ctx, "s", mustRef(to.cp.ID.String()), RollbackOptions{})
				must(t, err)
				if res.Mounted != mounted {
					t.Fatalf("%s: written through the mount: %v, want %v", what, res.Mounted, mounted)
				}
				checkRolledBack(t, e, "s", to.cp, to.merged, what)
			}
			write(t, p("src/other"), "a turn\n")
			c0 := take() // etc/config is the base's
			must(t, os.Rename(p("etc/config"), p("etc/moved")))
			must(t, os.Remove(p("etc/moved")))
			c1 := take() // etc/config whited out, no etc/moved
			rollback(c0, true, "back to the base file")
			must(t, os.Rename(p("etc/config"), p("etc/moved"))) // a copy-up, indexed, at a new name
			write(t, p("etc/moved"), "port=9\n")
			rollback(c1, true, "dropping the renamed copy-up") // removes etc/moved through the mount
			rollback(c0, true, "back to the base file again")
			if got, err := os.ReadFile(p("etc/config")); err != nil || string(got) != "port=1\n" {
				t.Fatalf("the base file after the rollbacks: %q, %v", got, err)
			}
		})
	}
}

// richSandbox opens an engine (the daemon's, with change tracking, when
// tracked) holding sandbox s on the rich base.
func richSandbox(t *testing.T, tracked bool) (*Engine, *CreateResult) {
	t.Helper()
	e := newEngine(t)
	if tracked {
		e = openTracking(t, filepath.Join(t.TempDir(), "home"))
	}
	cr, err := e.CreateSandbox(context.Background(), "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	return e, cr
}
