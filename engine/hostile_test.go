package engine

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/hostile"
)

// hostileHome is a home with one sandbox "s" whose head c1 holds one file
// over a one-file base.
func hostileHome(t *testing.T, oracle bool) (*Engine, *CreateResult, *delta.Checkpoint) {
	t.Helper()
	ctx := context.Background()
	e := openEngineOracle(t, filepath.Join(t.TempDir(), "home"), oracle)
	base := t.TempDir()
	write(t, filepath.Join(base, "a.txt"), "base\n")
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: base})
	must(t, err)
	write(t, filepath.Join(cr.Root, "b.txt"), "turn 1\n")
	r, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	c1, err := e.Resolve(ctx, mustRef(r.ID.String()))
	must(t, err)
	return e, cr, c1
}

func wantCorrupt(t *testing.T, what string, err error, fragments ...string) {
	t.Helper()
	if !errors.Is(err, errdefs.ErrCorrupt) {
		t.Errorf("%s: %v, want a corrupt-data error", what, err)
		return
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("%s: %v, want it to name %q", what, err, f)
		}
	}
}

// A hostile layer, written into the store as another host would upload it,
// is indexed by a rebuild and then refused, with the corrupt class, by
// verify (catalog and store-only), rollback and branch; a refused rollback
// leaves the live root mounted and as it was.
func TestHostileLayersAreRefusedEverywhere(t *testing.T) {
	cases, err := hostile.Cases(256 << 20)
	must(t, err)
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			ctx := context.Background()
			e, cr, c1 := hostileHome(t, false) // the store stays hostile
			pack, err := hostile.WritePack(ctx, e.stores.local, c.Blobs)
			must(t, err)
			id, err := hostile.WriteRecord(ctx, e.stores.local, c1, c.Root)
			must(t, err)
			if _, err := e.Rebuilder().RebuildCatalog(ctx); err != nil {
				t.Fatalf("rebuild with a hostile layer in %s: %v", pack, err)
			}
			before := mergedState(t, cr.Root)
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			alloc := ms.TotalAlloc
			_, err = e.Verifier().Verify(ctx, mustRef(id.String()))
			wantCorrupt(t, "verify", err, c.Want)
			runtime.ReadMemStats(&ms)
			if grew := ms.TotalAlloc - alloc; grew > 64<<20 {
				t.Errorf("verify allocated %d MiB", grew>>20)
			}
			_, err = e.Verifier().VerifyStore(ctx, mustRef(""))
			wantCorrupt(t, "verify --store-only", err, c.Want)
			_, err = e.Rollback(ctx, "s", mustRef(id.String()), RollbackOptions{})
			wantCorrupt(t, "rollback", err, c.Want)
			if ok, _ := mountinfo.Mounted(cr.Root); !ok {
				t.Error("a refused rollback left the root unmounted")
			}
			if after := mergedState(t, cr.Root); after != before {
				t.Error("a refused rollback changed the live root")
			}
			_, err = e.Branch(ctx, mustRef(id.String()), "b", BranchOptions{})
			wantCorrupt(t, "branch", err, c.Want)
			if _, err := os.Stat(e.home.sandboxDir("b")); err == nil {
				t.Error("a refused branch left its sandbox directory")
			}
			// The good checkpoint is untouched by all this.
			if _, err := e.Verifier().Verify(ctx, mustRef(c1.ID.String())); err != nil {
				t.Fatalf("verify of the good checkpoint: %v", err)
			}
		})
	}
}

// A pack header whose raw_length lies is corruption naming the blob and the
// pack, at rebuild and store-only verify; an index that carries the same lie
// is refused by verify, rollback and branch before any buffer is sized.
func TestLyingRawLengthIsCorruptNotAPanic(t *testing.T) {
	ctx := context.Background()
	for _, blobs := range hostile.LyingHeaders() {
		e, _, c1 := hostileHome(t, false) // it leaves a lie in the catalog
		pack, err := hostile.WritePack(ctx, e.stores.local, blobs)
		must(t, err)
		_, err = e.Rebuilder().RebuildCatalogWith(ctx, RebuildOptions{Strict: true})
		wantCorrupt(t, "rebuild --strict", err, pack, blobs[0].ID.String(), "raw length")
		// By default the pack is skipped, named, and the rest restored.
		rep, err := e.Rebuilder().RebuildCatalog(ctx)
		must(t, err)
		if len(rep.Skipped) != 1 || rep.Skipped[0].Name != pack || rep.Skipped[0].Class != SkipCorrupt ||
			!strings.Contains(rep.Skipped[0].Error, "raw length") || rep.Checkpoints != 2 || rep.Sandboxes != 1 {
			t.Fatalf("rebuild beside a lying pack: %+v", rep)
		}
		_, err = e.Verifier().VerifyStore(ctx, mustRef(""))
		wantCorrupt(t, "verify --store-only", err, pack, "raw length")
		must(t, e.stores.local.Delete(ctx, pack))

		// The same lie in the catalog, for the layer tree and for a chunk.
		var loc catalog.BlobLocation
		must(t, e.cat.View(ctx, func(tx *catalog.Tx) error { loc, _, err = tx.Blob(c1.FSTree); return err }))
		loc.RawLength, loc.Compression = blobs[0].RawLength, uint8(delta.CompressionZstd)
		must(t, e.cat.PutBlobs(ctx, map[delta.ID]catalog.BlobLocation{c1.FSTree: loc}))
		name := delta.PackName(loc.Pack)
		_, err = e.Verifier().Verify(ctx, mustRef(c1.ID.String()))
		wantCorrupt(t, "verify", err, c1.FSTree.String(), name)
		_, err = e.Rollback(ctx, "s", mustRef(c1.ID.String()), RollbackOptions{})
		wantCorrupt(t, "rollback", err, c1.FSTree.String(), name)
		_, err = e.Branch(ctx, mustRef(c1.ID.String()), "b", BranchOptions{})
		wantCorrupt(t, "branch", err, c1.FSTree.String(), name)
	}
}

// A base materialised under HOME/bases/ that was changed on disk is found
// by verify and refused by rollback and branch, which would spread it.
func TestDamagedMaterialisedBaseIsRefused(t *testing.T) {
	ctx := context.Background()
	e, cr, c1 := hostileHome(t, true)
	rep, err := e.Verifier().Verify(ctx, mustRef(c1.ID.String()))
	must(t, err)
	if !rep.BaseChecked {
		t.Fatal("verify did not check the materialised base")
	}
	p := filepath.Join(e.home.basesDir(), cr.Sandbox.BaseTree.String(), "a.txt")
	must(t, os.WriteFile(p, []byte("damaged\n"), 0o644))
	_, err = e.Verifier().Verify(ctx, mustRef(c1.ID.String()))
	wantCorrupt(t, "verify", err, "bases/"+cr.Sandbox.BaseTree.String())
	_, err = e.Branch(ctx, mustRef(c1.ID.String()), "b", BranchOptions{})
	wantCorrupt(t, "branch", err, "bases/"+cr.Sandbox.BaseTree.String())
	_, err = e.Rollback(ctx, "s", mustRef(cr.Checkpoint.ID.String()), RollbackOptions{})
	wantCorrupt(t, "rollback", err, "bases/"+cr.Sandbox.BaseTree.String())
}

// Verify walks what a restore walks: shared subtrees count each time they
// appear, so a few kilobytes of trees that restore as 69,905 entries are
// reported as such.
func TestVerifyReportsWhatARestoreWrites(t *testing.T) {
	ctx := context.Background()
	e, _, c1 := hostileHome(t, true)
	blobs, root := hostile.DAGBomb(16, 4) // 16^4 files, 16+256+4096+65536 dirs
	_, err := hostile.WritePack(ctx, e.stores.local, blobs)
	must(t, err)
	id, err := hostile.WriteRecord(ctx, e.stores.local, c1, root)
	must(t, err)
	_, err = e.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	rep, err := e.Verifier().Verify(ctx, mustRef(id.String()))
	must(t, err)
	base, err := e.Verifier().Verify(ctx, mustRef(c1.ID.String()))
	must(t, err)
	baseEntries := base.Entries - 1 // c1's layer holds b.txt
	if got, want := rep.Entries-baseEntries, uint64(65536*2+4096+256+16); got != want {
		t.Fatalf("verify says the layer restores %d entries, want %d", got, want)
	}
	if rep.Trees > 10 {
		t.Fatalf("verify read %d trees, want each distinct tree once", rep.Trees)
	}
}

// A file whose bytes are a tree's encoding has that tree's ID: whichever
// is stored first is the one copy the index keeps, in either order and
// across sandboxes (dedup is store-wide). Both checkpoints must still
// verify and restore: a sandbox must not be able to make another's tree,
// or its own file, unreadable by writing such a file.
func TestFileHoldingATreeEncoding(t *testing.T) {
	ctx := context.Background()
	when := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	// dir makes d/x with fixed metadata under root, so that two homes
	// encode the same tree for d.
	dir := func(root string) {
		must(t, os.MkdirAll(filepath.Join(root, "d"), 0o755))
		write(t, filepath.Join(root, "d", "x"), "a directory's one file\n")
		must(t, os.Chtimes(filepath.Join(root, "d", "x"), when, when))
	}
	base := t.TempDir()
	write(t, filepath.Join(base, "a.txt"), "base\n")
	create := func(e *Engine, name string) string {
		cr, err := e.CreateSandbox(ctx, delta.SandboxName(name), CreateOptions{Base: base})
		must(t, err)
		return cr.Root
	}
	checkpoint := func(e *Engine, name string) delta.ID {
		r, err := e.Checkpoint(ctx, delta.SandboxName(name), CheckpointOptions{})
		must(t, err)
		return r.ID
	}
	// treeOfD is the encoding of d's tree in name's head.
	treeOfD := func(e *Engine, id delta.ID) []byte {
		cp, err := e.Resolve(ctx, mustRef(id.String()))
		must(t, err)
		top, err := delta.LoadTree(ctx, e.data.repo, cp.FSTree)
		must(t, err)
		d := top.Find("d")
		if d == nil {
			t.Fatal("no d in the checkpoint's tree")
		}
		enc, err := e.data.repo.LoadBlob(ctx, delta.BlobTree, d.Subtree)
		must(t, err)
		return enc
	}
	// restores checks that a rollback of name to id puts want back at rel.
	restores := func(e *Engine, name, root string, id delta.ID, rel, want string) {
		if _, err := e.Verifier().Verify(ctx, mustRef(id.String())); err != nil {
			t.Fatalf("verify %s of %s: %v", id.Short(), name, err)
		}
		write(t, filepath.Join(root, rel), "changed\n")
		checkpoint(e, name)
		if _, err := e.Rollback(ctx, delta.SandboxName(name), mustRef(id.String()), RollbackOptions{}); err != nil {
			t.Fatalf("rollback of %s to %s: %v", name, id.Short(), err)
		}
		got, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil || string(got) != want {
			t.Fatalf("%s after rollback: %q, %v; want %q", rel, got, err, want)
		}
	}

	// The tree first, then a file in another sandbox holding its bytes.
	e := newEngine(t)
	ra := create(e, "a")
	dir(ra)
	ca := checkpoint(e, "a")
	enc := treeOfD(e, ca)
	rb := create(e, "b")
	write(t, filepath.Join(rb, "copy"), string(enc))
	cb := checkpoint(e, "b")
	restores(e, "b", rb, cb, "copy", string(enc))
	restores(e, "a", ra, ca, "d/x", "a directory's one file\n")
	checkAll(t, e)

	// The file first, in a fresh home; then a sandbox whose tree has its
	// bytes.
	e2 := newEngine(t)
	rf := create(e2, "file")
	write(t, filepath.Join(rf, "copy"), string(enc))
	cf := checkpoint(e2, "file")
	rt := create(e2, "tree")
	dir(rt)
	ct := checkpoint(e2, "tree")
	if got := treeOfD(e2, ct); !bytes.Equal(got, enc) {
		t.Fatal("the second home encodes d differently: the test no longer makes a collision")
	}
	restores(e2, "tree", rt, ct, "d/x", "a directory's one file\n")
	restores(e2, "file", rf, cf, "copy", string(enc))
	checkAll(t, e2)

	// Both in one turn (two packs then: a pack holds an ID once).
	e3 := newEngine(t)
	rs := create(e3, "s")
	dir(rs)
	write(t, filepath.Join(rs, "copy"), string(enc))
	cs := checkpoint(e3, "s")
	restores(e3, "s", rs, cs, "copy", string(enc))
	restores(e3, "s", rs, cs, "d/x", "a directory's one file\n")
	checkAll(t, e3)
}
