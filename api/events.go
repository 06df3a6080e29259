package api

import "time"

// Event is one event of GET /v1/events: a turn's, or a change of state
// (a sandbox created or removed, a rollback, branch or restore, a forget,
// a gc, a checkpoint remotely durable).
type Event struct {
	Seq uint64 `json:"seq"`
	// ID is "RUN:SEQ": RUN names this daemon's run, so an id from an
	// earlier run is never taken for one of this run's (a reconnecting
	// client sends it back as Last-Event-ID).
	ID   string    `json:"id"`
	Type string    `json:"type"`
	Time time.Time `json:"time"`
	// Sandbox and Checkpoint name the turn (Checkpoint is "" for started
	// and failed, and for a skip it is the head that already names the
	// state), or the sandbox and checkpoint a state change was about.
	Sandbox    string `json:"sandbox,omitempty"`
	Checkpoint string `json:"checkpoint,omitempty"`
	Class      string `json:"class,omitempty"` // the turn's class (committed)
	// ErrorClass and Error say why a turn or a restore failed.
	ErrorClass string             `json:"error_class,omitempty"`
	Error      string             `json:"error,omitempty"`
	BytesNew   int64              `json:"bytes_new,omitempty"`
	DurationMS float64            `json:"duration_ms,omitempty"`
	PhasesMS   map[string]float64 `json:"phases_ms,omitempty"`
	// Receipt is a rollback's or branch's receipt (engine/receipt),
	// also when the restore failed as restore_incomplete.
	Receipt *Receipt `json:"receipt,omitempty"`
	// Deleted counts what a forget (checkpoints) or gc (packs) deleted.
	Deleted int `json:"deleted,omitempty"`
	// Paths counts the paths a restore put back.
	Paths int `json:"paths,omitempty"`
	// After and Before bound the events a gap event stands for: those
	// after seq After and before seq Before (0: from an earlier run of
	// the daemon, whose events are gone).
	After  uint64 `json:"after,omitempty"`
	Before uint64 `json:"before,omitempty"`
}

// Event types.
const (
	EventStarted       = "started"
	EventCommitted     = "committed"
	EventRemoteDurable = "remote_durable"
	EventFailed        = "failed"
	EventCreated       = "sandbox_created"
	EventRemoved       = "sandbox_removed"
	EventRollback      = "rollback"
	EventBranch        = "branch"
	EventRestore       = "restore" // paths put back into a sandbox
	EventForget        = "forget"
	EventGC            = "gc"
	// EventGap stands for events a resuming client can no longer get:
	// older than the ring keeps, or from an earlier run. It is sent
	// instead of them, never silently left out.
	EventGap = "gap"
)
