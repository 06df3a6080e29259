// Package procs is the engine's use of the process runtime (package proc)
// for its sandboxes: each sandbox's one container and its long-lived
// processes. A Manager owns the runtime of one home (made on first use),
// the home's process bookkeeping (HOME/proc: baselines, the host probe,
// work directories for images) and the process half of every turn,
// restore, exec and ps. It never sees the catalog or the store: the engine
// hands it what it needs (Deps).
package procs

import (
	"context"
	"log/slog"
	"sync"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/proc"
)

// The checkpoint phases a Manager reaches (Deps.Phase). The engine's list
// of phases (engine.PhaseFreeze ... engine.PhaseCommit) names these.
const (
	PhaseFreeze = "freeze" // the container was just paused for the cut
	PhaseDump   = "dump"   // CRIU wrote the image; the container is still paused
	PhaseStore  = "store"  // the container runs again; the image is about to be stored
	// PhaseImageBlob is reported for every blob of the process image handed
	// to the store (hashed, about to be compressed and packed): tests count
	// it to prove none is while the container is frozen.
	PhaseImageBlob = "image-blob"
)

// Deps is what a Manager needs of the engine.
type Deps struct {
	// Home is the home directory: the container ids, the runtime's state
	// root and HOME/proc derive from it.
	Home string
	// CRIU is the CRIU binary; "" means proc's default.
	CRIU string
	Log  *slog.Logger
	// Phase reports reaching a checkpoint phase (PhaseFreeze, PhaseDump,
	// PhaseStore); nil: not reported.
	Phase func(phase string)
	// Progress names the step under way in the progress report, with the
	// bytes it will handle (0: unknown); nil: not reported.
	Progress func(step string, total int64)
	// IDs returns the home's content ID scheme, for storing and reading
	// process images.
	IDs func() delta.IDs
	// Loader returns what process images are read back from (the
	// engine's content repository, which a rebuild replaces).
	Loader func() delta.BlobLoader
	// Load begins an operation on sandbox name (the engine's lock on it)
	// and loads it, finishing what an interrupted operation left when
	// write is set and only reading otherwise. done ends the operation;
	// it is nil when err is not.
	Load func(ctx context.Context, name delta.SandboxName, write bool) (sb *Sandbox, done func(), err error)
}

// Sandbox is what Exec, Resume and List need of a sandbox the engine
// loaded.
type Sandbox struct {
	Root Root
	Head *delta.Checkpoint
	// Interrupted is what an interrupted operation left, as far as the
	// load did not finish it: nil when nothing.
	Interrupted *Interrupted
}

// Root is the sandbox's root filesystem as a container needs it.
type Root interface {
	Mount(ctx context.Context) error
	Path() string
}

// Manager runs the sandboxes' containers of one home. It is safe for
// concurrent use; the engine's per-sandbox locks keep two operations off
// one sandbox.
type Manager struct {
	home string
	d    Deps
	rtMu sync.Mutex
	rt   *proc.Runtime // process runtime, made on first use
}

// New returns the Manager of d.Home. It starts nothing: the runtime is
// made when a sandbox first needs it.
func New(d Deps) *Manager {
	if d.Log == nil {
		d.Log = slog.Default()
	}
	return &Manager{home: d.Home, d: d}
}

func (m *Manager) phase(name string) {
	if m.d.Phase != nil {
		m.d.Phase(name)
	}
}

func (m *Manager) progress(step string, total int64) {
	if m.d.Progress != nil {
		m.d.Progress(step, total)
	}
}
