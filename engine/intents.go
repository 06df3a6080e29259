package engine

import (
	"context"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/intent"
	"github.com/turnsnap/turnsnap/engine/procs"
)

// Interrupted operations (engine/intent): a rollback's intent, finished by
// the next command that loads the sandbox to change it, and the note of
// processes a rollback could not restore.

// Interrupted says what an interrupted operation left on a sandbox, for
// commands that report it rather than finish it (ps, diff, status). It is
// declared with the process listing that reports it (procs.ProcessList).
type Interrupted = procs.Interrupted

// intents returns the home's intents; it keeps no state of its own beyond
// the directory, so it is made on demand.
func (e *Engine) intents() *intent.Intents {
	return intent.New(intent.Deps{
		Dir: e.home.intentsDir(), Log: e.log, Loader: e.data.repo, Phase: e.phase, Procs: e.procs,
		Checkpoint: func(ctx context.Context, id delta.ID) (cp *delta.Checkpoint, err error) {
			err = e.view(ctx, func(tx *catalog.Tx) (err error) { cp, err = tx.Checkpoint(id); return err })
			return cp, err
		},
		MoveHead: e.moveHead, Untrack: e.untrack, ReadyImage: e.readyImage,
		AcceptRestored: e.receipts.AcceptRestored,
	})
}

// AbandonRollback discards the sandbox's interrupted rollback without
// finishing it (intent.Intents.Abandon): the root goes back to the head
// and the head's ref object names it again; the processes the rollback
// stopped stay stopped. No interrupted rollback is ErrPrecondition.
func (e *Engine) AbandonRollback(ctx context.Context, name delta.SandboxName) (*RestoreResult, error) {
	done, err := e.op(ctx, name)
	if err != nil {
		return nil, err
	}
	defer done()
	start := time.Now()
	st, err := e.viewSandbox(ctx, name)
	if err != nil {
		return nil, err
	}
	if err := e.rem.MustOwn(st.sb, st.owner, st.head.ID); err != nil {
		return nil, err
	}
	if err := e.intents().Abandon(ctx, string(name), st.intentSandbox(e.home.sandboxDir(name))); err != nil {
		return nil, err
	}
	return &RestoreResult{Sandbox: string(name), Checkpoint: st.head, Root: st.root.Path(), Duration: time.Since(start)}, nil
}

// intentSandbox is st as the intents see it; dir is its directory in the
// home.
func (st *sandboxState) intentSandbox(dir string) intent.Sandbox {
	return intent.Sandbox{Sandbox: st.sb, Root: st.root, Head: st.head, Dir: dir, Container: st.container}
}
