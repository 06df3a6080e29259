package remote

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/upload"
)

// Settings are the remote settings of a home's configuration that the
// remote side reads (engine.RemoteConfig, with the home's id).
type Settings struct {
	HomeID string
	// URL names the remote; "" without one.
	URL            string
	Concurrency    int
	BandwidthBytes int64
	LockStaleAfter time.Duration
}

// Deps is what Home needs of the engine. The stores, catalog and settings
// are function values because the engine replaces them (Setup gives a home
// its remote and keys; a catalog rebuild swaps the catalog and its blob
// reader): Home reads them as they are at each call.
type Deps struct {
	// Dir is the home's directory (its last-push.json).
	Dir string
	// Stores returns the local store and the remote one (nil without a
	// remote), both as the engine writes them (sealed in an encrypted home).
	Stores   func() (local, remote upload.Store)
	Catalog  func() *catalog.Catalog
	Blobs    func() delta.BlobLoader
	Settings func() Settings
	Log      *slog.Logger
	// Shared holds the engine's maintenance lock shared until release.
	Shared func() (release func())
	// Op holds sandbox name's operation lock (and Shared) until done.
	Op func(ctx context.Context, sandbox delta.SandboxName) (done func(), err error)
	// Rollback brings sandbox's root and head to checkpoint id, processes
	// too (Adopt continues a sandbox from the bucket's head).
	Rollback func(ctx context.Context, sandbox string, id delta.ID) error
}

// Home is the remote side of one turnsnap home: pushes and their queue,
// the ownership of sandboxes on a shared bucket (Adopt, host leases), the
// bucket's locks and the judgement of roots recorded by other homes.
type Home struct {
	d Deps
}

// New makes the remote side of a home.
func New(d Deps) *Home { return &Home{d: d} }

func (e *Home) remote() upload.Store {
	_, r := e.d.Stores()
	return r
}

func (e *Home) homeID() string { return e.d.Settings().HomeID }

func (e *Home) view(ctx context.Context, fn func(tx *catalog.Tx) error) error {
	return e.d.Catalog().View(ctx, fn)
}

// Push uploads queued objects through the host-wide scheduler (see
// Syncer.Push).
func (e *Home) Push(ctx context.Context, opts PushOptions) (*PushReport, error) {
	defer e.d.Shared()()
	return e.Syncer().Push(ctx, opts)
}

// Syncer is the remote side of this home as it is now.
func (e *Home) Syncer() *Syncer {
	st := e.d.Settings()
	local, rem := e.d.Stores()
	return &Syncer{Local: local, Remote: rem, Cat: e.d.Catalog(), Blobs: e.d.Blobs(), Log: e.d.Log, Done: e.saveLastPush,
		Concurrency: st.Concurrency, BandwidthBytes: st.BandwidthBytes, URL: st.URL, LockStaleAfter: st.LockStaleAfter, HomeID: st.HomeID}
}

// The queue functions below do nothing without a remote: a home without
// one has nothing to send.

// QueueCommit is QueueCommit, in a home with a remote.
func (e *Home) QueueCommit(tx *catalog.Tx, op Written, cp *delta.Checkpoint, newSandbox *delta.Sandbox) error {
	if e.remote() == nil {
		return nil
	}
	return QueueCommit(tx, op, cp, newSandbox)
}

// QueueRef is QueueRef, in a home with a remote.
func (e *Home) QueueRef(tx *catalog.Tx, sandbox, refObject string, target delta.ID, sandboxObject string) error {
	if e.remote() == nil {
		return nil
	}
	return QueueRef(tx, sandbox, refObject, target, sandboxObject)
}

// QueueDelete is QueueDelete, in a home with a remote.
func (e *Home) QueueDelete(tx *catalog.Tx, sandbox string, names ...string) error {
	if e.remote() == nil {
		return nil
	}
	return QueueDelete(tx, sandbox, names...)
}

// PendingCheckpoints returns the checkpoints that are not yet remotely
// durable: their records still wait in the upload queue. Without a remote
// it is empty. It reads only the catalog.
func (e *Home) PendingCheckpoints(ctx context.Context) (map[delta.ID]bool, error) {
	defer e.d.Shared()()
	out := map[delta.ID]bool{}
	if e.remote() == nil {
		return out, nil
	}
	err := e.view(ctx, func(tx *catalog.Tx) error {
		ps, err := tx.PendingUploads("")
		if err != nil {
			return err
		}
		for _, p := range ps {
			if strings.HasPrefix(p.Name, delta.RecordPrefix) {
				out[p.Checkpoint] = true
			}
		}
		// A fenced checkpoint's head was refused: it never becomes
		// remotely durable here (docs/STORAGE.md, "Ownership and fencing").
		fenced, err := tx.FencedCheckpoints()
		for _, id := range fenced {
			out[id] = true
		}
		return err
	})
	return out, err
}

// Fenced reports whether checkpoint id's head was refused because another
// home adopted its sandbox: it is never remotely durable. One catalog read.
func (e *Home) Fenced(ctx context.Context, id delta.ID) (fenced bool, err error) {
	err = e.view(ctx, func(tx *catalog.Tx) error { fenced, err = tx.IsFenced(id); return err })
	return fenced, err
}

// HasRemote says whether the home has a remote store.
func (e *Home) HasRemote() bool { return e.remote() != nil }
