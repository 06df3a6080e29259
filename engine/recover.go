package engine

import (
	"context"
	"os"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
)

// RecoverReport says what Recover found and repaired.
type RecoverReport struct {
	// Running are the sandboxes whose containers run (reattached: later
	// operations use them as they are).
	Running []string
	// Resumed are the sandboxes whose containers a killed turnsnap had left
	// frozen, now running again.
	Resumed []string
	// RollbacksFinished are the sandboxes whose killed rollback was
	// finished.
	RollbacksFinished []string
	// ProcessesLost are the sandboxes whose finished rollback could not
	// restore its processes (ps and status say why).
	ProcessesLost []string
	// Failed are the sandboxes that could not be checked, with the error.
	Failed map[string]string
}

// Recover checks every sandbox of this home after a crash: a rollback a
// killed turnsnap left half done is finished (its processes included), a
// container it left frozen is resumed, and the containers that run are
// found. Every command that changes a sandbox does the same for its
// sandbox; a daemon runs this beside serving at start (each sandbox's
// repair holds only that sandbox's lock) so that nothing waits for the
// next command and no sandbox waits for another's repair. Upload work needs nothing here:
// the queue is in the catalog, and the next push resumes it.
func (e *Engine) Recover(ctx context.Context) (*RecoverReport, error) {
	var names []delta.SandboxName
	err := e.view(ctx, func(tx *catalog.Tx) error {
		sbs, err := tx.Sandboxes()
		for _, sb := range sbs {
			names = append(names, sb.Name)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	rep := &RecoverReport{Failed: map[string]string{}}
	for _, name := range names {
		if _, err := os.Stat(e.home.sandboxDir(name)); err != nil {
			continue // not on this host (yet): nothing to repair
		}
		if err := e.recoverSandbox(ctx, name, rep); err != nil {
			rep.Failed[string(name)] = err.Error()
		}
	}
	return rep, nil
}

func (e *Engine) recoverSandbox(ctx context.Context, name delta.SandboxName, rep *RecoverReport) error {
	done, err := e.op(ctx, name)
	if err != nil {
		return err
	}
	defer done()
	var sb *delta.Sandbox
	if err := e.view(ctx, func(tx *catalog.Tx) (err error) { sb, err = tx.Sandbox(name); return err }); err != nil {
		return err
	}
	if _, ok := e.intents().Pending(sb); ok {
		st, err := e.loadSandbox(ctx, name)
		if err != nil {
			return err
		}
		rep.RollbacksFinished = append(rep.RollbacksFinished, string(name))
		if st.interrupted != nil && st.interrupted.ProcessesLost != "" {
			rep.ProcessesLost = append(rep.ProcessesLost, string(name))
		}
	}
	resumed, running, err := e.procs.Recover(ctx, name)
	if resumed {
		rep.Resumed = append(rep.Resumed, string(name))
	}
	if err != nil {
		return err
	}
	if running {
		rep.Running = append(rep.Running, string(name))
	}
	return nil
}
