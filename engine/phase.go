package engine

import "github.com/turnsnap/turnsnap/engine/procs"

// Checkpoint phases, in order, as Options.AtPhase reports them.
const (
	PhaseFreeze = procs.PhaseFreeze // the container was just paused for the cut
	PhaseScan   = "scan"            // the sandbox root was scanned (still paused if processes changed)
	PhaseDump   = procs.PhaseDump   // CRIU wrote the image; the container is still paused
	PhaseStore  = procs.PhaseStore  // the container runs again; the image is about to be stored
	// PhaseImageBlob: one blob of the process image is handed to the store
	// (reported for each; only after PhaseStore).
	PhaseImageBlob = procs.PhaseImageBlob
	PhaseCommit    = "commit" // everything is stored; the checkpoint is about to be committed
	// PhaseRecorded: the packs, the record and the head ref are in the
	// store; the catalog transaction that indexes a small turn's blobs and
	// adds the checkpoint is next.
	PhaseRecorded = "recorded"
	// PhaseCommitGroup: the catalog transaction that several concurrent
	// checkpoints share (a group commit) holds all their writes and is
	// about to commit.
	PhaseCommitGroup = "commit-group"
)

// progressPhase shows the step under way in the progress report (Options.
// Progress), with the bytes it will handle when known (0: unknown).
func (e *Engine) progressPhase(name string, total int64) { e.data.meter.SetPhase(name, total) }

// phase reports reaching a checkpoint phase to Options.AtPhase.
func (e *Engine) phase(name string) {
	if e.opts.AtPhase != nil {
		e.opts.AtPhase(name)
	}
}
