package engine

import (
	"context"
	"fmt"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
)

// The head's moves: a rollback (restore.go), and the finish or abandon of
// an interrupted one (engine/intent, through moveHead).

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

// moveHead points the sandbox's head at id: the ref object, then the catalog.
func (e *Engine) moveHead(ctx context.Context, name string, sb *delta.Sandbox, id delta.ID) error {
	return e.moveHeadAfter(ctx, name, sb, id, nil)
}

// putHead writes the sandbox's head ref object. It is stored under the
// sandbox's key (its id), so two homes' sandboxes of one name never share
// a head (FORMAT.md).
func (e *Engine) putHead(ctx context.Context, sb *delta.Sandbox, id delta.ID) error {
	return putRefObject(ctx, e.stores.front, delta.RefHead, string(sb.Key()), id)
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
		if err := e.rem.QueueRef(tx, name, delta.HeadObject(sb.Key()), id, ""); err != nil {
			return err
		}
		return tx.SetRef(delta.Ref{Kind: delta.RefHead, Name: name, Target: id})
	})
	if err != nil {
		return fmt.Errorf("sandbox %s: move head to %s: %w", name, id.Short(), err)
	}
	return nil
}
