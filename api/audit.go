package api

import "time"

// AuditReport is a sandbox's head lineage, one entry per checkpoint, oldest
// first: what each turn changed, what it cost, and what a weaker recovery
// would have lost had the sandbox crashed right after it.
//
// The wire form of engine.AuditReport.
type AuditReport struct {
	Sandbox string         `json:"sandbox"`
	Turns   []AuditTurn    `json:"turns"`
	Totals  AuditTotals    `json:"totals"`
	Classes map[string]int `json:"classes"`
}

// AuditTurn is one checkpoint.
//
// The wire form of engine.AuditTurn.
type AuditTurn struct {
	Turn       int       `json:"turn"`
	Checkpoint ID        `json:"checkpoint"`
	Parent     ID        `json:"parent"`
	Class      Class     `json:"class"`
	Message    string    `json:"message,omitempty"`
	Created    time.Time `json:"created"`
	BytesNew   int64     `json:"bytes_new"`
	DurationMS float64   `json:"duration_ms"`
	PauseMS    float64   `json:"pause_ms"`
	Added      int       `json:"added"`
	Modified   int       `json:"modified"`
	Deleted    int       `json:"deleted"`
	// Files lists the changes since the parent (at most MaxAuditFiles).
	Files     []AuditFile  `json:"files"`
	Truncated bool         `json:"files_truncated,omitempty"`
	Processes AuditProcess `json:"processes"`
	// ChatOnlyLoses is everything since the base; ChatFSLoses the
	// processes' state.
	ChatOnlyLoses AuditLoss `json:"chat_only_loses"`
	ChatFSLoses   AuditLoss `json:"chat_fs_loses"`
}

// AuditTotals sums the turns.
//
// The wire form of engine.AuditTotals.
type AuditTotals struct {
	Turns      int     `json:"turns"`
	BytesNew   int64   `json:"bytes_new"`
	DurationMS float64 `json:"duration_ms"`
}

// AuditFile is one changed path.
//
// The wire form of engine.AuditFile.
type AuditFile struct {
	Path     string `json:"path"`
	Change   string `json:"change"` // added, modified, deleted
	Type     string `json:"type"`
	Size     uint64 `json:"size"`
	PrevSize uint64 `json:"prev_size,omitempty"`
	// Meta lists metadata changes of a modified path (mode, owner,
	// mtime, xattrs, link target); Content says its bytes changed.
	Meta    []string `json:"meta,omitempty"`
	Content bool     `json:"content,omitempty"`
}

// AuditProcess is the turn's process state, from the records: the image
// the checkpoint carries and how it relates to its parent's.
//
// The wire form of engine.AuditProcess.
type AuditProcess struct {
	Image      bool   `json:"image"`
	State      string `json:"state"` // none, started, changed, unchanged, ended
	ImageBytes uint64 `json:"image_bytes"`
	ImageFiles int    `json:"image_files"`
	// Why is the record's reason the processes counted as changed (a
	// process appeared, exited, did I/O, its files changed). Empty when they
	// did not, and for records written before version 4 kept it.
	Why string `json:"why,omitempty"`
}

// AuditLoss is what a recovery method would not bring back.
//
// The wire form of engine.AuditLoss.
type AuditLoss struct {
	Paths     int    `json:"paths"`
	Bytes     uint64 `json:"bytes"`
	Processes bool   `json:"processes"`
	Summary   string `json:"summary"`
}
