package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/content"
	"github.com/turnsnap/turnsnap/engine/rebuild"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

func TestVerifyNamesEveryCorruptObject(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	agentTurn(t, cr.Root)
	c, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	rep, err := e.Verifier().Verify(ctx, mustRef(c.ID.String()))
	must(t, err)
	// The record, the base import's pack and this turn's pack at least.
	if len(rep.Objects) < 3 || rep.Chunks == 0 || rep.Trees == 0 {
		t.Fatalf("verify read too little to mean anything: %+v", rep)
	}
	for _, obj := range rep.Objects {
		p := filepath.Join(e.home.storeDir(), obj)
		orig, err := os.ReadFile(p)
		must(t, err)
		for _, at := range []int{0, len(orig) / 2, len(orig) - 1} {
			bad := append([]byte(nil), orig...)
			bad[at] ^= 0x01
			must(t, os.WriteFile(p, bad, 0o600))
			_, err := e.Verifier().Verify(ctx, mustRef(c.ID.String()))
			if err == nil || !strings.Contains(err.Error(), obj) {
				t.Errorf("byte %d of %s flipped: verify said %v, want an error naming the object", at, obj, err)
			}
			if err != nil && !errors.Is(err, errdefs.ErrCorrupt) {
				t.Errorf("byte %d of %s flipped: error is not ErrCorrupt: %v", at, obj, err)
			}
		}
		must(t, os.WriteFile(p, orig, 0o600))
	}
	if _, err := e.Verifier().Verify(ctx, mustRef(c.ID.String())); err != nil {
		t.Fatalf("verify after repairing every object: %v", err)
	}
	// A corrupt chunk is also caught on the restore path, naming the pack.
	target := rep.Objects[len(rep.Objects)-1]
	if strings.HasPrefix(target, "packs/") {
		p := filepath.Join(e.home.storeDir(), target)
		orig, _ := os.ReadFile(p)
		bad := append([]byte(nil), orig...)
		for i := 0; i < len(bad)/2; i++ {
			bad[i] ^= 0xff
		}
		must(t, os.WriteFile(p, bad, 0o600))
		_, err := e.Branch(ctx, mustRef(c.ID.String()), "from-corrupt", BranchOptions{})
		if err == nil {
			t.Fatal("branch from a corrupt pack succeeded")
		}
		must(t, os.WriteFile(p, orig, 0o600))
	}
}

// lineage is everything about history that a rebuild must preserve.
func lineage(t *testing.T, e *Engine) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	sbs, err := e.ListSandboxes(ctx)
	must(t, err)
	for _, s := range sbs {
		fmt.Fprintf(&b, "sandbox %s base=%s origin=%s head=%s\n", s.Sandbox.Name, s.Sandbox.BaseTree.Short(), s.Sandbox.Origin.Short(), s.Head.ID.Short())
		log, err := e.History().Log(ctx, s.Sandbox.Name)
		must(t, err)
		for _, l := range log {
			var kids []delta.ID
			must(t, e.view(ctx, func(tx *catalog.Tx) error { kids, err = tx.Children(l.ID); return err }))
			fmt.Fprintf(&b, "  %s parent=%s turn=%d class=%s head=%v onhead=%v fs=%s children=%d\n",
				l.ID.Short(), l.Parent.Short(), l.Turn, l.Class, l.Head, l.OnHead, l.FSTree.Short(), len(kids))
		}
	}
	return b.String()
}

// refcounts returns the refcount of every blob the catalog locates.
func refcounts(t *testing.T, e *Engine, ids []delta.ID) map[delta.ID]int64 {
	t.Helper()
	out := map[delta.ID]int64{}
	must(t, e.view(context.Background(), func(tx *catalog.Tx) error {
		for _, id := range ids {
			n, err := tx.RefCount(id)
			if err != nil {
				return err
			}
			out[id] = n
		}
		return nil
	}))
	return out
}

func TestCatalogRebuildKeepsLineage(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	agentTurn(t, cr.Root)
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{Message: "one"})
	must(t, err)
	write(t, filepath.Join(cr.Root, "second"), "2")
	_, err = e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	_, err = e.Rollback(ctx, "s", mustRef(c1.ID.String()), RollbackOptions{})
	must(t, err)
	write(t, filepath.Join(cr.Root, "third"), "3")
	_, err = e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	br, err := e.Branch(ctx, mustRef(c1.ID.String()), "b", BranchOptions{})
	must(t, err)
	write(t, filepath.Join(br.Root, "in-b"), "b")
	_, err = e.Checkpoint(ctx, "b", CheckpointOptions{Turn: new(int)})
	must(t, err)
	want := lineage(t, e)
	blobs := allBlobIDs(t, e)
	wantRefs := refcounts(t, e, blobs)

	// Lose the catalog entirely, then rebuild it from the store.
	must(t, e.cat.Close())
	must(t, os.RemoveAll(e.home.catalogDir()))
	e.cat, err = catalog.Open(ctx, e.home.catalogDir(), catalog.Options{})
	must(t, err)
	e.data.repo = content.New(e.stores.front, e.cat, e.data.codec, nil)
	rep, err := e.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	if rep.Checkpoints != 5 || rep.Sandboxes != 2 {
		t.Fatalf("rebuild found %d checkpoints and %d sandboxes, want 5 and 2", rep.Checkpoints, rep.Sandboxes)
	}
	if got := lineage(t, e); got != want {
		t.Fatalf("lineage after rebuild:\n%s\nwant:\n%s", got, want)
	}
	if got := refcounts(t, e, blobs); fmt.Sprint(got) != fmt.Sprint(wantRefs) {
		t.Fatalf("refcounts after rebuild differ from those maintained by commits")
	}
	if _, err := e.Verifier().Verify(ctx, mustRef(c1.ID.String())); err != nil {
		t.Fatal(err)
	}
	checkAll(t, e)
}

func TestFreshHomeRestoresFromStoreAlone(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	agentTurn(t, cr.Root)
	c, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	want := mergedState(t, cr.Root)

	// A second host: nothing but a copy of the store (no catalog, no base dir).
	home2 := filepath.Join(t.TempDir(), "home2")
	must(t, os.MkdirAll(home2, 0o700))
	if out, err := exec.Command("cp", "-a", e.home.storeDir(), filepath.Join(home2, "store")).CombinedOutput(); err != nil {
		t.Fatalf("copy store: %v: %s", err, out)
	}
	e2 := openEngine(t, home2)
	_, err = e2.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	br, err := e2.Branch(ctx, mustRef(c.ID.String()), "copy", BranchOptions{})
	must(t, err)
	if got := mergedState(t, br.Root); got != want {
		t.Fatalf("branch on a fresh home hashes to %s, want %s", got.Short(), want.Short())
	}
	// The original sandbox is known there too and comes back on first use.
	p, err := e2.SandboxPath(ctx, "s")
	must(t, err)
	if got := mergedState(t, p); got != want {
		t.Fatalf("sandbox on a fresh home hashes to %s, want %s", got.Short(), want.Short())
	}
}

func TestInterruptedRebuildKeepsOldCatalog(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	_, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	want := lineage(t, e)
	// A rebuild that died before it finished leaves an unmarked directory.
	must(t, os.MkdirAll(filepath.Join(rebuild.Dir(e.home.catalogDir()), "junk"), 0o700))
	must(t, e.Close())
	e2 := openEngine(t, e.Home())
	if got := lineage(t, e2); got != want {
		t.Fatalf("catalog after an interrupted rebuild:\n%s\nwant:\n%s", got, want)
	}
	if _, err := os.Stat(rebuild.Dir(e.home.catalogDir())); !os.IsNotExist(err) {
		t.Fatal("unfinished rebuild directory left behind")
	}
}

// allBlobIDs lists every blob in every pack of the store.
func allBlobIDs(t *testing.T, e *Engine) []delta.ID {
	t.Helper()
	ctx := context.Background()
	var out []delta.ID
	must(t, e.stores.front.List(ctx, delta.PackPrefix, func(oi upload.ObjectInfo) error {
		entries, err := delta.ReadPackHeader(ctx, upload.Ranges(e.stores.front), oi.Name)
		for _, en := range entries {
			out = append(out, en.ID)
		}
		return err
	}))
	if len(out) == 0 {
		t.Fatal("store holds no blobs")
	}
	return out
}
