package setup

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/keys"
	"github.com/turnsnap/turnsnap/engine/procs"
	"github.com/turnsnap/turnsnap/engine/remote"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// newHome is a set-up over a real local store and catalog, with no remote.
func newHome(t *testing.T, saved *RemoteConfig) (*Home, *catalog.Catalog, *int) {
	t.Helper()
	dir := t.TempDir()
	local, err := upload.NewLocal(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	cat, err := catalog.Open(context.Background(), filepath.Join(dir, "catalog"), catalog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	ring := keys.New(keys.Deps{Home: dir, Local: local, Wired: func(_, _, _ upload.Store) {}})
	if err := ring.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	rewired := new(int)
	nop := func() {}
	return New(Deps{
		Home:        dir,
		Exclusive:   func() func() { return nop },
		Shared:      func() func() { return nop },
		Keys:        ring,
		Remote:      func() *RemoteConfig { return saved },
		SaveRemote:  func(*RemoteConfig) error { t.Fatal("a refused set-up saves a remote"); return nil },
		NewRepo:     func() { *rewired++ },
		BackendIDs:  nop,
		RemoteStore: func() upload.Store { return nil },
		Catalog:     func() *catalog.Catalog { return cat },
		Syncer:      func() *remote.Syncer { t.Fatal("no syncer without a remote"); return nil },
		LastPush:    func() *remote.LastPush { return nil },
		Interrupted: func(*delta.Sandbox) *procs.Interrupted { return nil },
		Log:         slog.New(slog.DiscardHandler),
	}), cat, rewired
}

func TestSetupRefusals(t *testing.T) {
	ctx := context.Background()
	h, _, _ := newHome(t, nil)
	if _, err := h.Setup(ctx, SetupOptions{PlainLocal: true}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a plaintext local store without a key: %v", err)
	}
	if _, err := h.Init(ctx, RemoteConfig{URL: "s3://bucket"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a remote without an endpoint: %v", err)
	}
	h, _, rewired := newHome(t, &RemoteConfig{URL: "s3://one", Endpoint: "127.0.0.1:1"})
	if _, err := h.Init(ctx, RemoteConfig{URL: "s3://two", Endpoint: "127.0.0.1:1"}); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("a second remote: %v", err)
	}
	if *rewired != 1 {
		t.Fatalf("a failed set-up remade the repository %d times, want 1 (back on the old stores)", *rewired)
	}
}

func TestSetupStatusWithoutRemote(t *testing.T) {
	ctx := context.Background()
	h, cat, _ := newHome(t, nil)
	err := cat.Update(ctx, func(tx *catalog.Tx) error {
		return tx.PutSandbox(&delta.Sandbox{Name: "a", Backend: "overlay", BaseTree: delta.EmptyTree()})
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := h.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Remote != "" || st.QueueDepth != 0 || len(st.Sandboxes) != 1 {
		t.Fatalf("status: %+v", st)
	}
	if s := st.Sandboxes[0]; s.Sandbox != "a" || s.RemoteDurable {
		t.Fatalf("a sandbox without a remote: %+v", s)
	}
}

// TestQueueTotalsMatchStatus: the /metrics figures (QueueTotals, which
// reads only the upload queue) are Status's, queue full or empty.
func TestQueueTotalsMatchStatus(t *testing.T) {
	ctx := context.Background()
	h, cat, _ := newHome(t, nil)
	check := func(wantObjects int, wantBytes int64) {
		t.Helper()
		objects, bytes, err := h.QueueTotals(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st, err := h.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if objects != wantObjects || bytes != wantBytes || st.QueueDepth != objects || st.PendingBytes != bytes {
			t.Fatalf("QueueTotals %d objects, %d bytes; Status %d, %d; want %d, %d",
				objects, bytes, st.QueueDepth, st.PendingBytes, wantObjects, wantBytes)
		}
	}
	check(0, 0)
	err := cat.Update(ctx, func(tx *catalog.Tx) error {
		return tx.EnqueueUploads([]catalog.PendingUpload{
			{Sandbox: "a", Name: "packs/00/one", Size: 100},
			{Sandbox: "b", Name: "packs/00/two", Size: 20},
			{Sandbox: "b", Name: delta.RecordPrefix + "three", Size: 3},
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	check(3, 123)
}
