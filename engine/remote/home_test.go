package remote

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/upload"
)

// testHome is one home's remote side over a real local store and catalog,
// sharing remote with the other homes of a test.
type testHome struct {
	*Home
	id        string
	cat       *catalog.Catalog
	local     upload.Store
	rollbacks []delta.ID // what Adopt asked the engine to roll back to
}

func newTestHome(t *testing.T, id string, remote upload.Store, sbs []*delta.Sandbox, cps ...*delta.Checkpoint) *testHome {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	h := &testHome{id: id}
	var err error
	if h.local, err = upload.NewLocal(filepath.Join(dir, "store")); err != nil {
		t.Fatal(err)
	}
	if h.cat, err = catalog.Open(ctx, filepath.Join(dir, "catalog"), catalog.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.cat.Close() })
	err = h.cat.Update(ctx, func(tx *catalog.Tx) error {
		for _, cp := range cps {
			if err := tx.PutCheckpoint(cp); err != nil {
				return err
			}
		}
		for _, sb := range sbs {
			if err := tx.PutSandbox(sb); err != nil {
				return err
			}
			if err := tx.SetRef(delta.Ref{Kind: delta.RefHead, Name: string(sb.Name), Target: cps[len(cps)-1].ID}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	h.Home = New(Deps{
		Dir:      dir,
		Stores:   func() (upload.Store, upload.Store) { return h.local, remote },
		Catalog:  func() *catalog.Catalog { return h.cat },
		Blobs:    func() delta.BlobLoader { return nil },
		Settings: func() Settings { return Settings{HomeID: h.id, URL: "test://bucket"} },
		Log:      slog.Default(),
		Shared:   func() func() { return func() {} },
		Op:       func(context.Context, delta.SandboxName) (func(), error) { return func() {}, nil },
		Rollback: func(_ context.Context, _ string, id delta.ID) error {
			h.rollbacks = append(h.rollbacks, id)
			return nil
		},
	})
	return h
}

// record makes a checkpoint of sb with its id, as a commit would.
func record(t *testing.T, sb *delta.Sandbox, parent delta.ID, turn int) *delta.Checkpoint {
	t.Helper()
	cp := &delta.Checkpoint{Version: delta.RecordVersion, Sandbox: sb.Name, SandboxID: sb.ID, Parent: parent, Turn: turn,
		Class: delta.ClassFS, Backend: sb.Backend, BaseTree: sb.BaseTree, FSTree: delta.Hash([]byte{byte(turn)}),
		Created: time.Unix(int64(1000+turn), 0).UTC()}
	_, id, err := delta.EncodeRecord(cp)
	if err != nil {
		t.Fatal(err)
	}
	cp.ID = id
	return cp
}

// testAdoption runs one takeover on remote: the owner's live lease stops
// an adoption without force, a released one does not, the adopter's head
// carries the next epoch, and the old owner is fenced from then on.
func testAdoption(t *testing.T, remote upload.Store) {
	ctx := context.Background()
	homeA := delta.NewSandboxID()
	owner := &delta.Sandbox{ID: delta.NewSandboxID(), Home: homeA, Name: "s", Backend: "overlay", BaseTree: delta.Hash([]byte("base")), Created: time.Unix(1, 0).UTC()}
	c1 := record(t, owner, delta.ID{}, 1)
	a := newTestHome(t, homeA, remote, []*delta.Sandbox{owner}, c1)
	b := newTestHome(t, delta.NewSandboxID(), remote, []*delta.Sandbox{owner}, c1)
	key := owner.Key()
	head := delta.HeadObject(delta.SandboxKey(key))

	// Not pushed yet: nothing remotely durable to continue from.
	if _, err := b.Adopt(ctx, "s", AdoptOptions{}); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("adopting a sandbox whose head is not in the bucket: %v", err)
	}
	if err := upload.PutBytes(ctx, remote, head, delta.EncodeHead(c1.ID, delta.Owner{Home: a.id, Epoch: 1})); err != nil {
		t.Fatal(err)
	}

	// The owner's lease is live: no takeover without force.
	if err := a.RenewLease(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if lv, err := b.HostLease(ctx, a.id); err != nil || lv == nil || !lv.Live || lv.Home != a.id {
		t.Fatalf("owner's lease as another home reads it: %+v, %v", lv, err)
	}
	if _, err := b.Adopt(ctx, "s", AdoptOptions{}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("adopting from a live owner without force: %v, want ErrUnavailable", err)
	}
	if err := a.ReleaseLease(ctx); err != nil {
		t.Fatal(err)
	}
	if lv, err := b.HostLease(ctx, a.id); err != nil || lv != nil {
		t.Fatalf("released lease still read: %+v, %v", lv, err)
	}

	rep, err := b.Adopt(ctx, "s", AdoptOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := delta.Owner{Home: b.id, Epoch: 2}
	if rep.Owner != want || rep.From != (delta.Owner{Home: a.id, Epoch: 1}) || rep.Head != c1.ID || rep.Already {
		t.Fatalf("adopt report %+v", rep)
	}
	data, err := upload.ReadAllMax(ctx, remote, head, delta.MaxSmallObject)
	if err != nil {
		t.Fatal(err)
	}
	if id, o, err := delta.ParseHead(data); err != nil || id != c1.ID || o != want {
		t.Fatalf("bucket's head after adoption: %s %v %v", id.Short(), o, err)
	}
	if len(b.rollbacks) != 0 {
		t.Fatalf("adopter at the bucket's head rolled back to %v", b.rollbacks)
	}
	if rep, err := b.Adopt(ctx, "s", AdoptOptions{}); err != nil || !rep.Already {
		t.Fatalf("second adoption by the owner: %+v, %v", rep, err)
	}

	// The old owner does not know yet: the bucket refuses its head, and
	// once it has learned the owner it refuses locally.
	c2 := record(t, owner, c1.ID, 2)
	if err := upload.PutBytes(ctx, remote, delta.RecordName(c2.ID), []byte("record")); err != nil {
		t.Fatal(err)
	}
	if err := a.Syncer().writeHead(ctx, headJob(t, a.local, string(key), c2.ID)); !errors.Is(err, ErrFenced) {
		t.Fatalf("old owner's head write: %v, want ErrFenced", err)
	}
	var known delta.Owner
	a.cat.View(ctx, func(tx *catalog.Tx) (err error) { known, err = OwnerOf(tx, owner); return err })
	if known != want {
		t.Fatalf("fenced home knows owner %v, want %v", known, want)
	}
	if err := a.MustOwn(owner, known, c1.ID); !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), b.id) {
		t.Fatalf("old owner's MustOwn: %v", err)
	}
	if err := b.MustOwn(owner, known, c1.ID); err != nil {
		t.Fatalf("adopter's MustOwn: %v", err)
	}
}

func TestAdoptionInMemory(t *testing.T) { testAdoption(t, newCondStore()) }

func TestAdoptionOnMinIO(t *testing.T) {
	srv := miniotest.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	cfg, err := upload.ParseS3URL("s3://adopt/homes")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Endpoint, cfg.Insecure, cfg.CreateBucket = srv.Endpoint, true, true
	s3, err := upload.NewS3(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	testAdoption(t, upload.WithRetry(s3, upload.RetryPolicy{}))
}

// A home without a remote has nothing to send and nothing to fence.
func TestHomeWithoutRemote(t *testing.T) {
	ctx := context.Background()
	h := newTestHome(t, delta.NewSandboxID(), nil, nil)
	if h.HasRemote() {
		t.Fatal("HasRemote without a remote")
	}
	if _, err := h.Push(ctx, PushOptions{}); !errors.Is(err, ErrNoRemote) {
		t.Fatalf("push without a remote: %v", err)
	}
	if _, err := h.Adopt(ctx, "s", AdoptOptions{}); !errors.Is(err, ErrNoRemote) {
		t.Fatalf("adopt without a remote: %v", err)
	}
	if _, err := h.Locks(ctx); !errors.Is(err, ErrNoRemote) {
		t.Fatalf("locks without a remote: %v", err)
	}
	if err := h.RenewLease(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	err := h.cat.Update(ctx, func(tx *catalog.Tx) error {
		return h.QueueDelete(tx, "s", delta.TagPrefix+"t")
	})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := h.PendingCheckpoints(ctx); err != nil || len(p) != 0 {
		t.Fatalf("pending without a remote: %v %v", p, err)
	}
	h.cat.View(ctx, func(tx *catalog.Tx) error {
		if ps, _ := tx.PendingUploads(""); len(ps) != 0 {
			t.Fatalf("a home without a remote queued %d uploads", len(ps))
		}
		return nil
	})
}

func TestLastPushIsKept(t *testing.T) {
	h := newTestHome(t, delta.NewSandboxID(), newCondStore(), nil)
	if lp := h.LastPush(); lp != nil {
		t.Fatalf("last push before any: %+v", lp)
	}
	h.saveLastPush(&PushReport{Uploaded: 3, Bytes: 3000, Duration: time.Second}, errors.New("link down"))
	lp := h.LastPush()
	if lp == nil || lp.Uploaded != 3 || lp.BytesPerSec != 3000 || lp.Error != "link down" {
		t.Fatalf("last push %+v", lp)
	}
}

// A failed connection is retried at the next call, a made one kept.
func TestLazyStoreRetriesAFailedConnection(t *testing.T) {
	ctx := context.Background()
	inner := newCondStore()
	var calls atomic.Int32
	s := Lazy(func(context.Context) (upload.Store, error) {
		if calls.Add(1) == 1 {
			return nil, errdefs.ErrUnavailable
		}
		return inner, nil
	})
	if _, err := s.Stat(ctx, "x"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("first call: %v", err)
	}
	if err := upload.PutBytes(ctx, s, "x", []byte("1")); err != nil {
		t.Fatal(err)
	}
	c, err := upload.AsConditional(s)
	if err != nil {
		t.Fatal(err)
	}
	if _, v, err := c.GetVersion(ctx, "x", 10); err != nil || v == "" {
		t.Fatalf("conditional read through the lazy store: %q %v", v, err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("connected %d times, want 2", n)
	}
}
