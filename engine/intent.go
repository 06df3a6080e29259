package engine

import (
	"context"
	"errors"
	"fmt"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"os"
	"path/filepath"
	"strings"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
)

// A rollback changes two things that cannot change in one step: the root
// (one rename inside the backend) and the head (a ref object, then the
// catalog). Before the first, it writes an intent naming the checkpoint;
// after the last, it removes it. Whoever loads the sandbox next and finds
// an intent finishes the rollback (the restore is idempotent), so a killed
// rollback never leaves root and head disagreeing for longer than until
// the next command that uses the sandbox.
//
//	HOME/intents/rollback-NAME   hex ID of the checkpoint being rolled back to

func (h home) intentFile(sandbox string) string {
	return filepath.Join(string(h), "intents", "rollback-"+sandbox)
}

func (e *Engine) writeIntent(sandbox string, id delta.ID) error {
	p := e.home.intentFile(sandbox)
	if err := ensureDir(filepath.Dir(p)); err != nil {
		return err
	}
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("sandbox %s: rollback intent: %w", sandbox, err)
	}
	_, err = f.WriteString(id.String() + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err == nil {
		err = fsat.SyncDir(filepath.Dir(p))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("sandbox %s: rollback intent: %w", sandbox, err)
	}
	return nil
}

// A durable write a rollback starts beside its other steps, whose fsyncs
// would otherwise wait alone: the intent beside the live scan and the plan
// (it must be durable before the root's first write), the head's ref
// object beside the root's rewrite (the catalog's head moves after both).
// wait returns its result once it is durable; every one started is waited
// for before the rollback returns.
type asyncWrite struct {
	done chan struct{}
	err  error
}

func startWrite(f func() error) *asyncWrite {
	w := &asyncWrite{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.err = f()
	}()
	return w
}

// wait is nil-safe: a write never started has nothing to wait for.
func (w *asyncWrite) wait() error {
	if w == nil {
		return nil
	}
	<-w.done
	return w.err
}

func (e *Engine) clearIntent(sandbox string) error {
	if err := os.Remove(e.home.intentFile(sandbox)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("sandbox %s: rollback intent: %w", sandbox, err)
	}
	return fsat.SyncDir(filepath.Dir(e.home.intentFile(sandbox)))
}

// pendingRollback returns the checkpoint an interrupted rollback of sandbox
// was moving to, if there is one.
func (e *Engine) pendingRollback(sandbox string) (delta.ID, bool) {
	data, err := os.ReadFile(e.home.intentFile(sandbox))
	if err != nil {
		return delta.ID{}, false
	}
	id, err := delta.ParseID(strings.TrimSpace(string(data)))
	if err != nil {
		// A torn intent: the rename makes that impossible, but if it
		// happens the rollback had not started its switch.
		e.log.Warn("unreadable rollback intent dropped", "sandbox", sandbox, "err", err)
		os.Remove(e.home.intentFile(sandbox))
		return delta.ID{}, false
	}
	return id, true
}

// finishRollback completes an interrupted rollback of st to checkpoint id:
// root restored to it (again, if it already was) and head moved there.
func (e *Engine) finishRollback(ctx context.Context, name string, st *sandboxState, id delta.ID) error {
	e.log.Warn("finishing an interrupted rollback", "sandbox", name, "checkpoint", id.Short())
	var cp *delta.Checkpoint
	err := e.view(ctx, func(tx *catalog.Tx) (err error) { cp, err = tx.Checkpoint(id); return err })
	if err != nil {
		// The target is unknown here (a rebuilt catalog without it): the
		// head is what stands, so the root goes back to the head.
		e.log.Warn("rollback target unknown; restoring the head instead", "sandbox", name, "err", err)
		cp = st.head
	}
	e.untrack(name) // a restore remounts the root; the next turn walks
	if err := st.root.Restore(ctx, cp.FSTree, e.repo); err != nil {
		return fmt.Errorf("sandbox %s: finish interrupted rollback to %s: %w", name, cp.ID.Short(), err)
	}
	if err := e.moveHead(ctx, name, st.sb, cp.ID); err != nil {
		return err
	}
	st.head = cp
	return e.clearIntent(name)
}

// moveHead points the sandbox's head at id: the ref object, then the catalog.
func (e *Engine) moveHead(ctx context.Context, name string, sb *delta.Sandbox, id delta.ID) error {
	return e.moveHeadAfter(ctx, name, sb, id, nil)
}

// putHead writes the sandbox's head ref object. It is stored under the
// sandbox's key (its id), so two homes' sandboxes of one name never share
// a head (FORMAT.md).
func (e *Engine) putHead(ctx context.Context, sb *delta.Sandbox, id delta.ID) error {
	return e.putRefObject(ctx, delta.RefHead, sb.Key(), id)
}

// moveHeadAfter is moveHead whose ref object put (putHead of id) was
// started already; nil: it is written here.
func (e *Engine) moveHeadAfter(ctx context.Context, name string, sb *delta.Sandbox, id delta.ID, put *asyncWrite) error {
	err := put.wait() // nil-safe
	if put == nil {
		err = e.putHead(ctx, sb, id)
	}
	if err != nil {
		return err
	}
	err = e.cat.Update(ctx, func(tx *catalog.Tx) error {
		if err := e.queueRef(tx, name, delta.RefName(delta.RefHead, sb.Key()), id, ""); err != nil {
			return err
		}
		return tx.SetRef(delta.Ref{Kind: delta.RefHead, Name: name, Target: id})
	})
	if err != nil {
		return fmt.Errorf("sandbox %s: move head to %s: %w", name, id.Short(), err)
	}
	return nil
}
