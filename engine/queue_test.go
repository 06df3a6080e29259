package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/retention"
	"github.com/turnsnap/turnsnap/internal/faultproxy"
)

// historyHome is a home with one sandbox "s" and n checkpoints after turn
// 0, each changing one small file, and no remote yet.
func historyHome(t *testing.T, n int) (*Engine, []delta.ID) {
	t.Helper()
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	ids := []delta.ID{cr.Checkpoint.ID}
	for i := range n {
		write(t, filepath.Join(cr.Root, "turn"), fmt.Sprintf("turn %d", i))
		c, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
		must(t, err)
		ids = append(ids, c.ID)
	}
	return e, ids
}

// `init --remote` on a home with history, then prune (and gc) before the
// first sync: on the old code every later sync failed with "object
// records/...: not found", forever, because prune dequeued only from the
// sandbox's own queue while init had queued the history elsewhere. Now the
// pruned records leave the queue, every push succeeds, and the bucket ends
// with a consistent history a fresh home can rebuild and verify.
func TestPruneBeforeFirstSyncNeverWedgesTheQueue(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	e, ids := historyHome(t, 4)
	_, err := e.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "wedge"))
	must(t, err)
	pr, err := e.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 1})
	must(t, err)
	if len(pr.Deleted) != 4 {
		t.Fatalf("prune deleted %d, want 4", len(pr.Deleted))
	}
	_, err = e.Retention().GC(ctx, retention.GCOptions{Grace: -1})
	must(t, err)
	for i := range 2 {
		if _, err := e.Remote().Push(ctx, PushOptions{}); err != nil {
			t.Fatalf("push %d after prune before the first sync: %v", i+1, err)
		}
	}
	st, err := e.HomeSetup().Status(ctx)
	must(t, err)
	if st.QueueDepth != 0 {
		t.Fatalf("queue after push: %+v", st)
	}
	head := ids[len(ids)-1]
	if recs := remoteRecords(t, e); len(recs) != 1 || !recs[head.String()] {
		t.Fatalf("bucket records %v, want only the head %s", recs, head.Short())
	}
	f := newEngine(t)
	_, err = f.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "wedge"))
	must(t, err)
	_, err = f.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	if _, err := f.Verifier().Verify(ctx, mustRef(head.String())); err != nil {
		t.Fatal(err)
	}
	checkAll(t, e)
}

// `init` on a home with a long history: on the old code it failed with
// Badger's "Txn is too big" (one transaction, every record's dependencies
// naming every pack) after it had saved the remote. Now the queue is
// written in batches, each record waiting only for what it needs, and
// `status` right after init shows the sandbox's checkpoints as not remote
// yet (the old code accounted them to "_backfill" and showed s 100%
// uploaded while nothing was sent).
func TestInitOnLongHistory(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	const n = 200
	e, ids := historyHome(t, n)
	ir, err := e.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "long"))
	must(t, err)
	st, err := e.HomeSetup().Status(ctx)
	must(t, err)
	var s *SandboxStatus
	for i := range st.Sandboxes {
		if st.Sandboxes[i].Sandbox == "s" {
			s = &st.Sandboxes[i]
		}
	}
	if s == nil || s.PendingCheckpoints != len(ids) || s.Checkpoints != len(ids) || s.PendingBytes < s.StoredBytes/2 {
		t.Fatalf("status after init: %+v (queued %d); want all %d checkpoints of s pending", st, ir.Queued, len(ids))
	}
	if st.QueueDepth != ir.Queued {
		t.Fatalf("queue depth %d, init queued %d", st.QueueDepth, ir.Queued)
	}
	// Each record waits for its own packs, not for every pack.
	must(t, e.view(ctx, func(tx *catalog.Tx) error {
		all, err := tx.PendingUploads("")
		for _, p := range all {
			if strings.HasPrefix(p.Name, delta.RecordPrefix) && len(p.After) > 8 {
				t.Errorf("queued %s waits for %d objects", p.Name, len(p.After))
			}
		}
		return err
	}))
	_, err = e.Remote().Push(ctx, PushOptions{})
	must(t, err)
	if recs := remoteRecords(t, e); len(recs) != len(ids) {
		t.Fatalf("bucket has %d records, want %d", len(recs), len(ids))
	}
	if st, _ = e.HomeSetup().Status(ctx); st.QueueDepth != 0 {
		t.Fatalf("queue after push: %d", st.QueueDepth)
	}
}

// The remote is saved only once the queue is complete: an init whose
// backfill fails leaves the home without a remote (so `status` cannot
// claim anything uploaded), and a second init completes the queue.
func TestInitSavesTheRemoteOnlyAfterTheQueue(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	e, ids := historyHome(t, 2)
	proxy, err := faultproxy.Start("http://"+srv.Endpoint, func(r faultproxy.Request) faultproxy.Fault {
		if r.Method == "GET" && r.Query.Has("list-type") {
			return faultproxy.Fault{Kind: faultproxy.Fail500}
		}
		return faultproxy.Fault{}
	})
	must(t, err)
	t.Cleanup(func() { proxy.Close() })
	if _, err := e.HomeSetup().Init(ctx, remoteCfg(proxy.Addr, "late")); err == nil {
		t.Fatal("init succeeded though the bucket could not be listed")
	}
	cfg, err := loadConfig(e.home)
	must(t, err)
	st, err := e.HomeSetup().Status(ctx)
	must(t, err)
	if cfg.Remote != nil || e.stores.remote != nil || st.Remote != "" {
		t.Fatalf("a failed init saved the remote: config %+v, status %+v", cfg.Remote, st)
	}
	_, err = e.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "late"))
	must(t, err)
	_, err = e.Remote().Push(ctx, PushOptions{})
	must(t, err)
	if recs := remoteRecords(t, e); len(recs) != len(ids) {
		t.Fatalf("bucket has %d records, want %d", len(recs), len(ids))
	}
}
