package engine

import (
	"context"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/content"
	"github.com/turnsnap/turnsnap/engine/remote"
)

// PushOptions configures Push.
type PushOptions = remote.PushOptions

// PushReport says what a push did.
type PushReport = remote.PushReport

// errNoRemote is returned by remote operations on a home without a remote.
var errNoRemote = remote.ErrNoRemote

// backfillSandbox attributes uploads that belong to no sandbox in particular.
const backfillSandbox = remote.BackfillSandbox

// Push uploads queued objects through the host-wide scheduler (see
// remote.Syncer.Push).
func (e *Engine) Push(ctx context.Context, opts PushOptions) (*PushReport, error) {
	defer e.shared()()
	return e.syncer().Push(ctx, opts)
}

// syncer is the remote side of this home as it is now.
func (e *Engine) syncer() *remote.Syncer {
	s := &remote.Syncer{Local: e.local, Remote: e.remote, Cat: e.cat, Blobs: e.repo, Log: e.log, Done: e.saveLastPush}
	if rc := e.config.Remote; rc != nil {
		s.Concurrency, s.BandwidthBytes, s.URL = rc.Concurrency, rc.BandwidthBytes, rc.URL
		s.LockStaleAfter = time.Duration(rc.LockStaleAfterNs)
	}
	s.HomeID = e.config.HomeID
	return s
}

// The queue functions below do nothing without a remote: a home without
// one has nothing to send.

func (e *Engine) queueCommit(tx *catalog.Tx, op *content.Op, cp *delta.Checkpoint, newSandbox *delta.Sandbox) error {
	if e.remote == nil {
		return nil
	}
	return remote.QueueCommit(tx, op, cp, newSandbox)
}

func (e *Engine) queueRef(tx *catalog.Tx, sandbox, refObject string, target delta.ID, sandboxObject string) error {
	if e.remote == nil {
		return nil
	}
	return remote.QueueRef(tx, sandbox, refObject, target, sandboxObject)
}

func (e *Engine) queueDelete(tx *catalog.Tx, sandbox string, names ...string) error {
	if e.remote == nil {
		return nil
	}
	return remote.QueueDelete(tx, sandbox, names...)
}

// PendingCheckpoints returns the checkpoints that are not yet remotely
// durable: their records still wait in the upload queue. Without a remote
// it is empty. It reads only the catalog.
func (e *Engine) PendingCheckpoints(ctx context.Context) (map[delta.ID]bool, error) {
	defer e.shared()()
	out := map[delta.ID]bool{}
	if e.remote == nil {
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
func (e *Engine) Fenced(ctx context.Context, id delta.ID) (fenced bool, err error) {
	err = e.view(ctx, func(tx *catalog.Tx) error { fenced, err = tx.IsFenced(id); return err })
	return fenced, err
}

// HasRemote says whether the home has a remote store.
func (e *Engine) HasRemote() bool { return e.remote != nil }
