package engine

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/retention"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// sharedBucket makes homes on one bucket, each plaintext or, with a key
// file, encrypted with the same master key.
type sharedBucket struct {
	rc  RemoteConfig
	key string // "" for a plaintext bucket
}

func newSharedBucket(t *testing.T, bucket string, encrypted bool) *sharedBucket {
	t.Helper()
	srv := startMinIO(t)
	sb := &sharedBucket{rc: remoteCfg(srv.Endpoint, bucket)}
	if encrypted {
		sb.key = keyFile(t)
	}
	return sb
}

func (sb *sharedBucket) home(t *testing.T) *Engine { t.Helper(); return sb.homeWith(t, true) }

// homeWith is home whose final oracles run only if oracle (a test that
// deletes what its catalog names says false).
func (sb *sharedBucket) homeWith(t *testing.T, oracle bool) *Engine {
	t.Helper()
	e := openEngineOracle(t, filepath.Join(t.TempDir(), "home"), oracle)
	rc := sb.rc
	_, err := e.HomeSetup().Setup(context.Background(), SetupOptions{Remote: &rc, KeyFile: sb.key})
	must(t, err)
	return e
}

// turns takes n checkpoints of sandbox name, each a new file content.
func turns(t *testing.T, e *Engine, name, root string, n int) []delta.ID {
	t.Helper()
	var ids []delta.ID
	for range n {
		write(t, filepath.Join(root, "turn"), fmt.Sprintf("%s turn %d %d", name, len(ids), time.Now().UnixNano()))
		c, err := e.Checkpoint(context.Background(), delta.SandboxName(name), CheckpointOptions{})
		must(t, err)
		ids = append(ids, c.ID)
	}
	return ids
}

func push(t *testing.T, e *Engine) {
	t.Helper()
	_, err := e.Remote().Push(context.Background(), PushOptions{})
	must(t, err)
}

// restorable is the oracle of these tests: the bucket as a fresh home
// sees it verifies object by object (verify --store-only), and a rebuild
// from it succeeds with want sandboxes, each head verifying.
func (sb *sharedBucket) restorable(t *testing.T, want int) {
	t.Helper()
	ctx := context.Background()
	c := sb.home(t)
	if _, err := c.Verifier().VerifyStore(ctx, mustRef("")); err != nil {
		t.Fatalf("verify --store-only of the bucket from a fresh home: %v", err)
	}
	rep, err := c.Rebuilder().RebuildCatalog(ctx)
	if err != nil {
		t.Fatalf("rebuild from the bucket: %v", err)
	}
	if rep.Sandboxes != want {
		t.Fatalf("rebuild from the bucket found %d sandboxes, want %d", rep.Sandboxes, want)
	}
	sbs, err := c.ListSandboxes(ctx)
	must(t, err)
	for _, si := range sbs {
		if _, err := c.Verifier().Verify(ctx, mustRef(si.Head.ID.String())); err != nil {
			t.Fatalf("head of %s (%s) from a fresh home: %v", si.Sandbox.Name, si.Head.ID.Short(), err)
		}
	}
}

// loadMarks reads e's mark object in the bucket (none: an empty one).
func loadMarks(t *testing.T, e *Engine) *delta.Marks {
	t.Helper()
	name := delta.MarkName(e.config.HomeID)
	data, err := upload.ReadAllMax(context.Background(), e.stores.remote, name, delta.MaxMarksObject)
	if errors.Is(err, errdefs.ErrNotFound) {
		return &delta.Marks{Version: 1, Home: e.config.HomeID}
	}
	must(t, err)
	m, err := delta.DecodeMarks(name, data)
	must(t, err)
	return m
}

// ageMarks moves e's mark object d into the past, as if its grace had
// passed.
func ageMarks(t *testing.T, e *Engine, d time.Duration) {
	t.Helper()
	m := loadMarks(t, e)
	if len(m.Records) == 0 {
		t.Fatal("no mark object to age")
	}
	for i := range m.Records {
		m.Records[i].Marked = m.Records[i].Marked.Add(-d)
		m.Records[i].Due = m.Records[i].Due.Add(-d)
	}
	data, err := delta.EncodeMarks(m)
	must(t, err)
	must(t, upload.PutBytes(context.Background(), e.stores.remote, delta.MarkName(e.config.HomeID), data))
}

func markedIDs(t *testing.T, e *Engine) []delta.ID {
	t.Helper()
	var out []delta.ID
	for _, mk := range loadMarks(t, e).Records {
		out = append(out, mk.ID)
	}
	return out
}

// Issue 23, item 1. Home A checkpoints x and pushes; home B rebuilds and
// branches A's head as xc, which has no checkpoint of its own, and pushes;
// A checkpoints twice more and prunes to 2 with gc. The checkpoint B's head
// names is not A's to delete: on the code before retention read the
// bucket's refs, A's prune deleted it and the bucket was unrestorable (and
// verify --store-only reported it corrupt).
func TestPruneKeepsWhatAnotherHomeBranched(t *testing.T) {
	for _, enc := range []bool{false, true} {
		t.Run(map[bool]string{false: "plaintext", true: "encrypted"}[enc], func(t *testing.T) {
			ctx := context.Background()
			sb := newSharedBucket(t, "branched", enc)
			a, b := sb.home(t), sb.home(t)
			cr := smallSandbox(t, a, "x")
			ids := turns(t, a, "x", cr.Root, 4)
			push(t, a)

			_, err := b.Rebuilder().RebuildCatalog(ctx)
			must(t, err)
			_, err = b.Branch(ctx, mustRef(ids[3].String()), "xc", BranchOptions{})
			must(t, err)
			push(t, b)

			ids = append(ids, turns(t, a, "x", cr.Root, 2)...)
			push(t, a)
			pr, err := a.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 2}) // no grace: swept in this run
			must(t, err)
			if slices.Contains(pr.Deleted, ids[3]) {
				t.Fatalf("a's prune deleted %s, the head of b's xc", ids[3].Short())
			}
			if len(pr.Deleted) != 4 || len(pr.Marked) != 0 {
				t.Fatalf("a's prune deleted %v, marked %v; want x's first 4 deleted", pr.Deleted, pr.Marked)
			}
			_, err = a.Retention().GC(ctx, retention.GCOptions{Grace: -1})
			must(t, err)
			if !remoteRecords(t, a)[ids[3].String()] {
				t.Fatalf("record %s, b's head, is gone from the bucket", ids[3].Short())
			}
			if _, err := a.Verifier().VerifyStore(ctx, mustRef("")); err != nil {
				t.Fatalf("a's verify --store-only after prune and gc: %v", err)
			}
			sb.restorable(t, 2)
		})
	}
}

// A prune with a grace only marks; home B branches from a marked checkpoint
// and pushes before the sweep; the sweep (a gc after the grace) deletes
// the other marked records and unmarks the one B's refs name.
func TestSweepSparesABranchMadeAfterTheMark(t *testing.T) {
	ctx := context.Background()
	sb := newSharedBucket(t, "marked", false)
	a, b := sb.home(t), sb.home(t)
	cr := smallSandbox(t, a, "x")
	ids := turns(t, a, "x", cr.Root, 4)
	push(t, a)
	before := len(remoteRecords(t, a))

	pr, err := a.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 1, Grace: time.Hour})
	must(t, err)
	if len(pr.Deleted) != 0 || len(pr.Marked) != 4 {
		t.Fatalf("prune with a grace deleted %v and marked %d; want nothing deleted, 4 marked", pr.Deleted, len(pr.Marked))
	}
	for _, m := range pr.Marked {
		if d := time.Until(m.DeleteAfter); d < 59*time.Minute || d > time.Hour {
			t.Fatalf("checkpoint %s marked to go in %s, want the hour's grace", m.ID.Short(), d)
		}
	}
	if n := len(remoteRecords(t, a)); n != before {
		t.Fatalf("the bucket holds %d records after marking, had %d", n, before)
	}
	if got := listNames(t, a.stores.remote, delta.MarkPrefix); len(got) != 1 || got[0] != delta.MarkName(a.config.HomeID) {
		t.Fatalf("mark objects in the bucket: %v", got)
	}
	// A gc before the grace is over sweeps nothing, and the marked records
	// keep their packs.
	gr, err := a.Retention().GC(ctx, retention.GCOptions{Grace: -1})
	must(t, err)
	if gr.RecordsSwept != 0 {
		t.Fatalf("gc before the grace swept %d records", gr.RecordsSwept)
	}
	for _, id := range ids {
		if _, err := a.Verifier().Verify(ctx, mustRef(id.String())); err != nil {
			t.Fatalf("marked checkpoint %s after gc: %v", id.Short(), err)
		}
	}

	_, err = b.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	_, err = b.Branch(ctx, mustRef(ids[1].String()), "xc", BranchOptions{})
	must(t, err)
	push(t, b)

	ageMarks(t, a, time.Hour)
	gr, err = a.Retention().GC(ctx, retention.GCOptions{Grace: -1})
	must(t, err)
	if gr.RecordsSwept != 3 {
		t.Fatalf("gc after the grace swept %d records, want 3 (all marked but b's branch point)", gr.RecordsSwept)
	}
	inBucket := remoteRecords(t, a)
	if !inBucket[ids[1].String()] {
		t.Fatalf("record %s, b's head, was swept", ids[1].Short())
	}
	if inBucket[ids[0].String()] || inBucket[ids[2].String()] {
		t.Fatal("the sweep left records no ref names")
	}
	if got := markedIDs(t, a); len(got) != 0 {
		t.Fatalf("still marked after the sweep: %v", got)
	}
	// Pinned by b's refs now: a later prune does not mark it again.
	pr, err = a.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 1, Grace: time.Hour})
	must(t, err)
	if len(pr.Marked) != 0 || len(pr.Deleted) != 0 {
		t.Fatalf("a second prune marked %v, deleted %v", pr.Marked, pr.Deleted)
	}
	checkAll(t, a)
	sb.restorable(t, 2)
}

// With no grace a ref another home wrote before the run protects its
// record: a tag, and the origin of a branch that has moved on. And the
// sweep itself re-reads the bucket: a ref written after the mark keeps its
// record even when the sweep is given no pins of its own.
func TestGraceZeroSweepHonoursEveryRef(t *testing.T) {
	ctx := context.Background()
	sb := newSharedBucket(t, "rereads", true)
	a, b := sb.home(t), sb.home(t)
	cr := smallSandbox(t, a, "x")
	ids := turns(t, a, "x", cr.Root, 5)
	push(t, a)

	_, err := b.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	_, err = b.History().Tag(ctx, "b-keeps", mustRef(ids[0].String()))
	must(t, err)
	br, err := b.Branch(ctx, mustRef(ids[1].String()), "xc", BranchOptions{})
	must(t, err)
	turns(t, b, "xc", br.Root, 1) // xc's head is its own now; only its origin names ids[1]
	push(t, b)

	pr, err := a.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 1})
	must(t, err)
	if len(pr.Deleted) != 3 || slices.Contains(pr.Deleted, ids[0]) || slices.Contains(pr.Deleted, ids[1]) {
		t.Fatalf("prune deleted %v; want x's first checkpoint, %s and %s", pr.Deleted, ids[2].Short(), ids[3].Short())
	}

	// The sweep's own look at the bucket: mark, then b tags a marked
	// checkpoint, then sweep.
	ids = append(ids, turns(t, a, "x", cr.Root, 2)...)
	push(t, a)
	pr, err = a.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 1, Grace: time.Hour})
	must(t, err)
	if len(pr.Marked) != 2 {
		t.Fatalf("prune marked %d, want 2 (%s, %s)", len(pr.Marked), ids[4].Short(), ids[5].Short())
	}
	_, err = b.Rebuilder().RebuildCatalog(ctx) // b learns of a's new checkpoints
	must(t, err)
	_, err = b.History().Tag(ctx, "late", mustRef(ids[5].String()))
	must(t, err)
	push(t, b)
	// A gc after the grace sweeps. a's catalog pins neither record (its
	// head is newer, and it has not seen b's tag): only the sweep's own
	// reading of the bucket keeps ids[5].
	ageMarks(t, a, 2*time.Hour)
	gr, err := a.Retention().GC(ctx, retention.GCOptions{Grace: -1})
	must(t, err)
	inBucket := remoteRecords(t, a)
	if gr.RecordsSwept != 1 || inBucket[ids[4].String()] {
		t.Fatalf("sweep deleted %d records (%s still in the bucket: %v); want only %s",
			gr.RecordsSwept, ids[4].Short(), inBucket[ids[4].String()], ids[4].Short())
	}
	if got := markedIDs(t, a); len(got) != 0 {
		t.Fatalf("still marked after the sweep: %v", got)
	}
	if !inBucket[ids[5].String()] {
		t.Fatalf("record %s, tagged by b before the sweep, is gone", ids[5].Short())
	}
	sb.restorable(t, 2)
}

// B branches from A's checkpoint but has not pushed when A's prune sweeps
// it and A's gc collects its packs: B's push puts the record (and its
// packs) back before its head, so the bucket stays restorable.
func TestPushReuploadsARefTargetSweptMeanwhile(t *testing.T) {
	ctx := context.Background()
	sb := newSharedBucket(t, "window", false)
	a, b := sb.home(t), sb.home(t)
	cr := smallSandbox(t, a, "x")
	ids := turns(t, a, "x", cr.Root, 4)
	push(t, a)
	_, err := b.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	_, err = b.Branch(ctx, mustRef(ids[3].String()), "xc", BranchOptions{})
	must(t, err)

	ids = append(ids, turns(t, a, "x", cr.Root, 2)...)
	push(t, a)
	pr, err := a.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 2})
	must(t, err)
	if !slices.Contains(pr.Deleted, ids[3]) {
		t.Fatalf("prune kept %s, which no ref in the bucket names yet: the test exercises nothing", ids[3].Short())
	}
	_, err = a.Retention().GC(ctx, retention.GCOptions{Grace: -1})
	must(t, err)
	if remoteRecords(t, a)[ids[3].String()] {
		t.Fatal("record still in the bucket after the sweep")
	}
	push(t, b)
	if !remoteRecords(t, a)[ids[3].String()] {
		t.Fatalf("b's push uploaded its head without the record %s it names", ids[3].Short())
	}
	sb.restorable(t, 2)
}

// A ref whose record neither the bucket nor this host has fails the push
// naming the checkpoint, and the ref is not uploaded.
func TestPushRefusesARefToAMissingRecord(t *testing.T) {
	ctx := context.Background()
	sb := newSharedBucket(t, "missing", false)
	a := sb.homeWith(t, false) // it deletes a record its catalog names
	cr := smallSandbox(t, a, "x")
	ids := turns(t, a, "x", cr.Root, 2)
	push(t, a)
	_, err := a.History().Tag(ctx, "gone", mustRef(ids[0].String()))
	must(t, err)
	must(t, a.stores.remote.Delete(ctx, delta.RecordName(ids[0])))
	must(t, a.stores.local.Delete(ctx, delta.RecordName(ids[0])))
	_, err = a.Remote().Push(ctx, PushOptions{})
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), ids[0].Short()) {
		t.Fatalf("push of a tag naming a lost record: %v, want ErrNotFound naming %s", err, ids[0].Short())
	}
	if _, err := a.stores.remote.Stat(ctx, delta.RefName(delta.RefTag, "gone")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the tag reached the bucket: %v", err)
	}
}
