package retention

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// home is a Retention over real parts: a catalog and a local store in
// t.TempDir(), and with bucket set, a second local store as the remote.
// Its history is its catalog's checkpoints, all of one sandbox this home
// owns, the newest the sandbox's head.
type home struct {
	rt             *Retention
	parts          Parts
	cps            []*delta.Checkpoint // oldest first
	locked, frozen int
	mu             sync.Mutex
}

type noLock struct{}

func (noLock) Context(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithCancel(ctx)
}
func (noLock) Release(context.Context) {}

type noBlobs struct{}

func (noBlobs) LoadBlob(_ context.Context, _ delta.BlobType, id delta.ID) ([]byte, error) {
	return nil, fmt.Errorf("blob %s: %w", id.Short(), errdefs.ErrNotFound)
}

func newHome(t *testing.T, bucket bool, turns int) *home {
	t.Helper()
	ctx := context.Background()
	cat, err := catalog.Open(ctx, t.TempDir(), catalog.Options{})
	must(t, err)
	t.Cleanup(func() { cat.Close() })
	local, err := upload.NewLocal(t.TempDir())
	must(t, err)
	h := &home{parts: Parts{HomeID: delta.NewSandboxID(), Catalog: cat, Store: local, Local: local, Blobs: noBlobs{}}}
	if bucket {
		h.parts.Remote, err = upload.NewLocal(t.TempDir())
		must(t, err)
		h.parts.Store = upload.NewTiered(local, h.parts.Remote)
	}
	sbID := delta.NewSandboxID()
	start := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	for i := range turns {
		cp := &delta.Checkpoint{Version: delta.RecordVersion, Sandbox: "s", SandboxID: sbID, Turn: i, Class: delta.ClassFS,
			Backend: "overlay", BaseTree: delta.Hash([]byte("base")), FSTree: delta.Hash(fmt.Appendf(nil, "layer %d", i)),
			Created: start.Add(time.Duration(i) * time.Hour)}
		must(t, cat.Update(ctx, func(tx *catalog.Tx) error { return tx.PutCheckpoint(cp) }))
		data, _, err := delta.EncodeRecord(cp)
		must(t, err)
		for _, s := range []upload.Store{local, h.parts.Remote} {
			if s != nil {
				must(t, upload.PutBytes(ctx, s, delta.RecordName(cp.ID), data))
			}
		}
		h.cps = append(h.cps, cp)
	}
	var maint sync.RWMutex
	h.rt = New(Deps{
		Home:  t.TempDir(),
		Parts: func() Parts { return h.parts },
		Exclusive: func() func() {
			maint.Lock()
			h.locked++
			return maint.Unlock
		},
		Shared:      func() func() { maint.RLock(); return maint.RUnlock },
		LoadHistory: h.history,
		DropFrozen:  func(context.Context) { h.mu.Lock(); h.frozen++; h.mu.Unlock() },
		LockBucket:  func(context.Context, string) (BucketLock, error) { return noLock{}, nil },
		ReadPackHeader: func(ctx context.Context, name string) ([]delta.PackEntry, error) {
			return nil, fmt.Errorf("object %s: %w", name, errdefs.ErrNotFound)
		},
		LoaderFor: func(map[delta.ID]catalog.BlobLocation) delta.BlobLoader { return noBlobs{} },
	})
	return h
}

// history is the catalog's checkpoints of sandbox s, its newest the head.
func (h *home) history(ctx context.Context) (*History, error) {
	hi := NewHistory()
	err := h.parts.Catalog.View(ctx, func(tx *catalog.Tx) error {
		for _, cp := range h.cps {
			got, err := tx.Checkpoint(cp.ID)
			if errors.Is(err, errdefs.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			hi.BySandbox[got.SandboxKey()] = append(hi.BySandbox[got.SandboxKey()], got)
		}
		return nil
	})
	if len(h.cps) > 0 {
		key := h.cps[0].SandboxKey()
		hi.Owned[key], hi.Known[key] = true, true
		hi.Names[key], hi.Keys["s"] = "s", key
		hi.Pin.Add(h.cps[len(h.cps)-1].ID, "head of s")
	}
	return hi, err
}

// left is what the catalog and the stores still hold of h's checkpoints.
func (h *home) left(t *testing.T) (inCatalog, inLocal, inBucket []int) {
	t.Helper()
	ctx := context.Background()
	for _, cp := range h.cps {
		must(t, h.parts.Catalog.View(ctx, func(tx *catalog.Tx) error {
			if _, err := tx.Checkpoint(cp.ID); err == nil {
				inCatalog = append(inCatalog, cp.Turn)
			}
			return nil
		}))
		if _, err := h.parts.Local.Stat(ctx, delta.RecordName(cp.ID)); err == nil {
			inLocal = append(inLocal, cp.Turn)
		}
		if h.parts.Remote != nil {
			if _, err := h.parts.Remote.Stat(ctx, delta.RecordName(cp.ID)); err == nil {
				inBucket = append(inBucket, cp.Turn)
			}
		}
	}
	return inCatalog, inLocal, inBucket
}

// Without a remote, prune deletes at once what it does not keep: the
// records in the local store and the catalog; the head stays whatever
// --keep-last says.
func TestPruneWithoutARemoteDeletesAtOnce(t *testing.T) {
	ctx := context.Background()
	h := newHome(t, false, 5)
	dry, err := h.rt.Prune(ctx, PruneOptions{KeepLast: 2, DryRun: true})
	must(t, err)
	if len(dry.Deleted) != 3 || h.frozen != 0 {
		t.Fatalf("dry run: deleted %v, frozen layers dropped %d times", dry.Deleted, h.frozen)
	}
	if cat, _, _ := h.left(t); len(cat) != 5 {
		t.Fatalf("a dry run deleted: catalog holds turns %v", cat)
	}
	rep, err := h.rt.Prune(ctx, PruneOptions{KeepLast: 2})
	must(t, err)
	if rep.Kept != 2 || len(rep.Deleted) != 3 || len(rep.Marked) != 0 {
		t.Fatalf("prune kept %d, deleted %v, marked %v; want 2, 3, none", rep.Kept, rep.Deleted, rep.Marked)
	}
	cat, local, _ := h.left(t)
	if !slices.Equal(cat, []int{3, 4}) || !slices.Equal(local, []int{3, 4}) {
		t.Fatalf("left: catalog %v, local store %v; want turns 3 and 4", cat, local)
	}
	if h.frozen != 1 || h.locked != 2 {
		t.Fatalf("frozen layers dropped %d times, exclusive lock taken %d times; want 1, 2", h.frozen, h.locked)
	}
	if _, err := h.rt.Prune(ctx, PruneOptions{}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("prune --keep-last 0: %v, want ErrInvalid", err)
	}
}

// With a remote, a prune with a grace only marks (the mark object names
// each record with its due time); a later run with no grace sweeps them
// from the bucket, the local store and the catalog, and removes the empty
// mark object. A ref in the bucket naming a marked record unmarks it.
func TestPruneWithARemoteMarksThenSweeps(t *testing.T) {
	ctx := context.Background()
	h := newHome(t, true, 5)
	rep, err := h.rt.Prune(ctx, PruneOptions{KeepLast: 1, Grace: time.Hour})
	must(t, err)
	if len(rep.Deleted) != 0 || len(rep.Marked) != 4 {
		t.Fatalf("prune with a grace deleted %v, marked %d; want none, 4", rep.Deleted, len(rep.Marked))
	}
	markName := delta.MarkName(h.parts.HomeID)
	data, err := upload.ReadAll(ctx, h.parts.Remote, markName)
	must(t, err)
	m, err := delta.DecodeMarks(markName, data)
	must(t, err)
	if len(m.Records) != 4 || time.Until(m.Records[0].Due) < 59*time.Minute {
		t.Fatalf("mark object: %+v", m)
	}
	if cat, _, bucket := h.left(t); len(cat) != 5 || len(bucket) != 5 {
		t.Fatalf("marking deleted records: catalog %v, bucket %v", cat, bucket)
	}

	// Another home tags turn 1 before the sweep.
	must(t, upload.PutBytes(ctx, h.parts.Remote, delta.RefName(delta.RefTag, "theirs"), delta.EncodeRef(h.cps[1].ID)))
	rep, err = h.rt.Prune(ctx, PruneOptions{KeepLast: 1})
	must(t, err)
	if len(rep.Deleted) != 3 || len(rep.Marked) != 0 {
		t.Fatalf("prune with no grace deleted %v, marked %v; want 3, none", rep.Deleted, rep.Marked)
	}
	cat, local, bucket := h.left(t)
	for _, got := range [][]int{cat, local, bucket} {
		if !slices.Equal(got, []int{1, 4}) {
			t.Fatalf("left: catalog %v, local %v, bucket %v; want turns 1 (tagged in the bucket) and 4 (head)", cat, local, bucket)
		}
	}
	if _, err := h.parts.Remote.Stat(ctx, markName); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("mark object after the sweep: %v, want none", err)
	}
}

// Policies are stored in HOME/retention.json: a sandbox's replaces the
// home's for it, and clearing it falls back to the home's.
func TestPolicyStore(t *testing.T) {
	ctx := context.Background()
	h := newHome(t, false, 3)
	must(t, h.rt.SetPolicy(ctx, PolicyOptions{Policy: Policy{KeepDaily: 7}}))
	must(t, h.rt.SetPolicy(ctx, PolicyOptions{Sandbox: "s", Policy: Policy{KeepLast: 1}}))
	v, err := h.rt.ShowPolicies(ctx, "")
	must(t, err)
	if v.Home == nil || v.Home.KeepDaily != 7 || len(v.Sandboxes) != 1 || v.Sandboxes[0].Source != "sandbox" || v.Sandboxes[0].Policy.KeepLast != 1 {
		t.Fatalf("policies: %+v", v)
	}
	rep, err := h.rt.ApplyPolicies(ctx, 0)
	must(t, err)
	if rep.CheckpointsKept != 1 || rep.CheckpointsDeleted != 2 {
		t.Fatalf("apply kept %d, deleted %d; want 1, 2", rep.CheckpointsKept, rep.CheckpointsDeleted)
	}
	must(t, h.rt.ClearPolicy(ctx, PolicyOptions{Sandbox: "s"}))
	if v, err = h.rt.ShowPolicies(ctx, "s"); err != nil || v.Sandboxes[0].Source != "home" {
		t.Fatalf("after clear: %+v, %v", v, err)
	}
	if err := h.rt.SetPolicy(ctx, PolicyOptions{Sandbox: "nosuch", Policy: Policy{KeepLast: 1}}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("policy of a missing sandbox: %v, want ErrNotFound", err)
	}
	if err := h.rt.SetPolicy(ctx, PolicyOptions{}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("empty policy: %v, want ErrInvalid", err)
	}
}

// bucketPins reads every kind of ref: heads with and without an owner
// line, tags, and branch origins; a damaged ref fails it (retention that
// cannot see every ref deletes nothing).
func TestBucketPins(t *testing.T) {
	ctx := context.Background()
	s, err := upload.NewLocal(t.TempDir())
	must(t, err)
	id := func(s string) delta.ID { return delta.Hash([]byte(s)) }
	put := func(name string, data []byte) { must(t, upload.PutBytes(ctx, s, name, data)) }
	sbA, sbB, home := delta.NewSandboxID(), delta.NewSandboxID(), delta.NewSandboxID()
	put(delta.RefName(delta.RefHead, sbA), delta.EncodeRef(id("plain head")))
	put(delta.RefName(delta.RefHead, sbB), delta.EncodeHead(id("owned head"), delta.Owner{Home: home, Epoch: 3}))
	put(delta.RefName(delta.RefTag, "release"), delta.EncodeRef(id("tagged")))
	for _, d := range []delta.Sandbox{
		{ID: sbA, Home: home, Name: "a", Backend: "overlay", BaseTree: id("base"), Origin: id("origin")},
		{ID: sbB, Home: home, Name: "b", Backend: "overlay", BaseTree: id("base")}, // from a base: no origin
	} {
		data, err := json.Marshal(d)
		must(t, err)
		put(delta.SandboxName(d.ID), data)
	}
	pin := Pins{}
	must(t, bucketPins(ctx, s, pin))
	for what, want := range map[string]delta.ID{"head": id("plain head"), "owned head": id("owned head"), "tag": id("tagged"), "origin": id("origin")} {
		if len(pin[want]) == 0 {
			t.Errorf("%s %s not pinned: %v", what, want.Short(), pin)
		}
	}
	if len(pin) != 4 {
		t.Errorf("pinned %d checkpoints, want 4: %v", len(pin), pin)
	}
	if why := strings.Join(pin[id("origin")], ","); !strings.Contains(why, "branched: a") {
		t.Errorf("origin pinned for %q", why)
	}

	put(delta.RefName(delta.RefHead, delta.NewSandboxID()), []byte("not a ref\n"))
	if err := bucketPins(ctx, s, Pins{}); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("bucketPins over a damaged head: %v, want ErrCorrupt", err)
	}
}
