package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/retention"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// Two homes share a bucket, each with a sandbox named "s". Neither may see
// the other's checkpoints as its own, a prune on one after a rebuild from
// the bucket (which brings in the other's history) must leave the other's
// records alone, and a third home rebuilding from the bucket sees two
// sandboxes. On the code before sandbox ids, B's rebuild merged both
// histories under "s" and its prune deleted A's checkpoints from the bucket.
func TestTwoHomesOneBucketNoCrossTalk(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	cfg := remoteCfg(srv.Endpoint, "shared")
	hosts := map[string]*Engine{"a": newEngine(t), "b": newEngine(t)}
	own := map[string]map[delta.ID]bool{}
	for _, h := range []string{"a", "b"} {
		e := hosts[h]
		_, err := e.HomeSetup().Init(ctx, cfg)
		must(t, err)
		cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
		must(t, err)
		own[h] = map[delta.ID]bool{cr.Checkpoint.ID: true}
		for i := range 3 {
			write(t, filepath.Join(cr.Root, "turn"), fmt.Sprintf("%s turn %d", h, i))
			c, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
			must(t, err)
			own[h][c.ID] = true
		}
		_, err = e.Remote().Push(ctx, PushOptions{})
		must(t, err)
	}
	a, b := hosts["a"], hosts["b"]
	if n := len(listNames(t, a.stores.remote, delta.SandboxPrefix)); n != 2 {
		t.Fatalf("bucket holds %d sandbox descriptions, want 2 (one per home)", n)
	}
	if n := len(listNames(t, a.stores.remote, delta.HeadPrefix)); n != 2 {
		t.Fatalf("bucket holds %d heads, want 2 (one per home)", n)
	}

	// B rebuilds from the bucket: it now knows A's sandbox too, under
	// another label, and its own "s" holds only its own history.
	rep, err := b.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	if rep.Sandboxes != 2 || rep.Checkpoints != 8 {
		t.Fatalf("rebuild on b: %d sandboxes, %d checkpoints; want 2, 8", rep.Sandboxes, rep.Checkpoints)
	}
	if got := checkpointsOf(t, b, "s"); !sameIDs(got, own["b"]) {
		t.Fatalf("b's sandbox s after rebuild holds %v, want only b's %v", got, own["b"])
	}
	sbs, err := b.ListSandboxes(ctx)
	must(t, err)
	var foreign string
	for _, si := range sbs {
		if si.Sandbox.Name != "s" {
			foreign = string(si.Sandbox.Name)
			if !own["a"][si.Head.ID] {
				t.Fatalf("a's sandbox on b (%s) has head %s, not a's", foreign, si.Head.ID.Short())
			}
		}
	}
	if !strings.HasPrefix(foreign, "s.") || !sameIDs(checkpointsOf(t, b, foreign), own["a"]) {
		t.Fatalf("a's sandbox on b is %q with %v", foreign, checkpointsOf(t, b, foreign))
	}

	// B prunes: its own old checkpoints go, A's all stay in the bucket.
	pr, err := b.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 1})
	must(t, err)
	if len(pr.Deleted) != 3 {
		t.Fatalf("b's prune deleted %d checkpoints, want its own 3: %v", len(pr.Deleted), pr.Deleted)
	}
	for _, id := range pr.Deleted {
		if !own["b"][id] {
			t.Fatalf("b's prune deleted %s, a checkpoint of a", id.Short())
		}
	}
	inBucket := remoteRecords(t, a)
	for id := range own["a"] {
		if !inBucket[id.String()] {
			t.Fatalf("a's checkpoint %s is gone from the bucket after b's prune", id.Short())
		}
	}
	_, err = b.Remote().Push(ctx, PushOptions{})
	must(t, err)

	// A rebuilds too: its "s" is its own, with all four checkpoints.
	_, err = a.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	if got := checkpointsOf(t, a, "s"); !sameIDs(got, own["a"]) {
		t.Fatalf("a's sandbox s after rebuild holds %v, want %v", got, own["a"])
	}
	// A third home sees both, and branches from either.
	c := newEngine(t)
	_, err = c.HomeSetup().Init(ctx, cfg)
	must(t, err)
	rep, err = c.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	if rep.Sandboxes != 2 || rep.Checkpoints != 5 {
		t.Fatalf("rebuild on c: %d sandboxes, %d checkpoints; want 2, 5", rep.Sandboxes, rep.Checkpoints)
	}
	// C owns neither: its prune deletes nothing.
	pr, err = c.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 1})
	must(t, err)
	if len(pr.Deleted) != 0 {
		t.Fatalf("a home that owns nothing pruned %v", pr.Deleted)
	}
	for _, e := range []*Engine{a, b, c} {
		checkAll(t, e)
	}
}

// A description stored under one object name may not claim another
// sandbox; a damaged record or description is skipped and reported, and
// the rest rebuilt; with Strict it fails the rebuild naming it (ErrCorrupt,
// exit 7) and leaves the catalog as it was. A legacy
// description (no id) and a version 1 record still read.
func TestRebuildRejectsImpostorsAndSkipsCorrupt(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	a := newEngine(t)
	_, err := a.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "impostor"))
	must(t, err)
	cr, err := a.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	agentTurn(t, cr.Root)
	c1, err := a.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	_, err = a.Remote().Push(ctx, PushOptions{})
	must(t, err)

	// A legacy sandbox as an older turnsnap wrote it: description under its
	// name, no id; a version 1 record; head under the name.
	var cp1 *delta.Checkpoint
	must(t, a.view(ctx, func(tx *catalog.Tx) (err error) { cp1, err = tx.Checkpoint(c1.ID); return err }))
	old := *cp1
	old.Version, old.SandboxID, old.Sandbox, old.Parent = 1, "", "old", delta.ID{}
	data, oldID, err := delta.EncodeRecord(&old)
	must(t, err)
	must(t, upload.PutBytes(ctx, a.stores.remote, delta.RecordName(oldID), data))
	legacy, _ := json.Marshal(delta.Sandbox{Name: "old", Backend: cr.Sandbox.Backend, BaseTree: cr.Sandbox.BaseTree, Created: time.Now().UTC()})
	must(t, upload.PutBytes(ctx, a.stores.remote, delta.SandboxObject(delta.SandboxKey("old")), legacy))
	must(t, upload.PutBytes(ctx, a.stores.remote, delta.HeadObject(delta.SandboxKey("old")), delta.EncodeRef(oldID)))

	// The impostor: s's description copied under another id's name.
	real, err := upload.ReadAll(ctx, a.stores.remote, delta.SandboxObject(delta.SandboxKey(cr.Sandbox.ID)))
	must(t, err)
	impostor := delta.SandboxObject(delta.SandboxKey(delta.NewSandboxID()))
	must(t, upload.PutBytes(ctx, a.stores.remote, impostor, real))
	badRecord := delta.RecordName(delta.Hash([]byte("not a record")))
	must(t, upload.PutBytes(ctx, a.stores.remote, badRecord, []byte("{garbage")))

	b := newEngine(t)
	_, err = b.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "impostor"))
	must(t, err)
	_, err = b.Rebuilder().RebuildCatalogWith(ctx, RebuildOptions{Strict: true})
	if !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), strings.TrimPrefix(badRecord, delta.RecordPrefix)) && !strings.Contains(err.Error(), impostor) {
		t.Fatalf("rebuild over damaged objects: %v, want ErrCorrupt naming one", err)
	}
	if sbs, _ := b.ListSandboxes(ctx); len(sbs) != 0 {
		t.Fatalf("a failed rebuild replaced the catalog: %d sandboxes", len(sbs))
	}
	rep, err := b.Rebuilder().RebuildCatalogWith(ctx, RebuildOptions{SkipCorrupt: true})
	must(t, err)
	var skipped []string
	for _, c := range rep.Corrupt {
		skipped = append(skipped, c.Name)
	}
	if len(skipped) != 2 || !strings.Contains(strings.Join(skipped, " "), impostor) || !strings.Contains(strings.Join(skipped, " "), badRecord) {
		t.Fatalf("skipped %v, want %s and %s", skipped, impostor, badRecord)
	}
	if rep.Sandboxes != 2 || rep.Checkpoints != 3 {
		t.Fatalf("rebuild kept %d sandboxes, %d checkpoints; want 2 (s, old), 3", rep.Sandboxes, rep.Checkpoints)
	}
	if got := checkpointsOf(t, b, "old"); len(got) != 1 || got[0] != oldID {
		t.Fatalf("legacy sandbox old holds %v, want [%s]", got, oldID.Short())
	}
	if got := checkpointsOf(t, b, "s"); len(got) != 2 {
		t.Fatalf("sandbox s holds %v, want its 2 checkpoints", got)
	}
	_, err = b.Branch(ctx, mustRef(oldID.String()), "from-old", BranchOptions{})
	must(t, err)
}

func listNames(t *testing.T, s upload.Store, prefix string) []string {
	t.Helper()
	var out []string
	must(t, s.List(context.Background(), prefix, func(oi upload.ObjectInfo) error { out = append(out, oi.Name); return nil }))
	return out
}

func checkpointsOf(t *testing.T, e *Engine, sandbox string) []delta.ID {
	t.Helper()
	var out []delta.ID
	must(t, e.view(context.Background(), func(tx *catalog.Tx) error {
		cps, err := tx.SandboxCheckpoints(delta.SandboxName(sandbox))
		for _, cp := range cps {
			out = append(out, cp.ID)
		}
		return err
	}))
	return out
}

func sameIDs(got []delta.ID, want map[delta.ID]bool) bool {
	if len(got) != len(want) {
		return false
	}
	for _, id := range got {
		if !want[id] {
			return false
		}
	}
	return true
}

// The checkpoints of a sandbox this home created and then removed stay
// this home's to prune (ownership is noted at removal).
func TestPruneReclaimsARemovedOwnSandbox(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "gone", CreateOptions{Base: richBase(t)})
	must(t, err)
	for i := range 3 {
		write(t, filepath.Join(cr.Root, "turn"), fmt.Sprint(i))
		_, err := e.Checkpoint(ctx, "gone", CheckpointOptions{})
		must(t, err)
	}
	must(t, e.RemoveSandbox(ctx, "gone"))
	pr, err := e.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 1})
	must(t, err)
	if len(pr.Deleted) != 3 || pr.Kept != 1 {
		t.Fatalf("prune of a removed own sandbox: deleted %d, kept %d; want 3, 1", len(pr.Deleted), pr.Kept)
	}
	checkAll(t, e)
}
