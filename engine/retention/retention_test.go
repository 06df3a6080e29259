package retention

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
			hi.BySandbox[string(got.SandboxKey())] = append(hi.BySandbox[string(got.SandboxKey())], got)
		}
		return nil
	})
	if len(h.cps) > 0 {
		key := h.cps[0].SandboxKey()
		hi.Owned[string(key)], hi.Known[string(key)] = true, true
		hi.Names[string(key)], hi.Keys["s"] = "s", string(key)
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
