package engine

import (
	"context"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/procs"
)

// Sandbox processes (engine/procs): each sandbox can run one container,
// started by the first exec; a turn checkpoints its processes with its
// files, a restore brings them back. The engine keeps one procs.Manager.

// The process layer's types, under the names the engine's callers use.
type (
	ExecOptions      = procs.ExecOptions
	ExecFunc         = procs.ExecFunc
	CommandError     = procs.CommandError
	ResumeResult     = procs.ResumeResult
	ProcessesOptions = procs.ProcessesOptions
	ProcessInfo      = procs.ProcessInfo
	ProcessList      = procs.ProcessList
)

// Processes returns the sandboxes' processes: exec, ps, resume.
func (e *Engine) Processes() *procs.Manager { return e.procs }

// newProcs makes the engine's process manager. Its sandboxes are loaded
// as every operation loads them: under the sandbox's lock, interrupted
// work finished (write) or only reported.
func newProcs(e *Engine, home home) *procs.Manager {
	return procs.New(procs.Deps{
		Home: string(home), Log: e.log, Phase: e.phase, Progress: e.progressPhase, IDs: func() delta.IDs { return e.keys.IDs() },
		Loader: func() delta.BlobLoader { return e.data.repo },
		Load: func(ctx context.Context, name delta.SandboxName, write bool) (*procs.Sandbox, func(), error) {
			done, err := e.op(ctx, name)
			if err != nil {
				return nil, nil, err
			}
			load := e.viewSandbox
			if write {
				load = e.loadSandbox
			}
			st, err := load(ctx, name)
			if err != nil {
				done()
				return nil, nil, err
			}
			return &procs.Sandbox{Root: st.root, Head: st.head, Interrupted: st.interrupted}, done, nil
		},
	})
}
