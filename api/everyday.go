package api

import (
	"fmt"
	"strings"
	"time"
)

// DiffResult lists what differs between two states of a sandbox.
//
// The wire form of history.DiffResult.
type DiffResult struct {
	Sandbox string `json:"sandbox"`
	From    string `json:"from"` // checkpoint id, or "working" for the live root
	To      string `json:"to"`

	Paths []PathChange `json:"changes"`
	// Interrupted is what an interrupted operation left on the sandbox
	// (a diff reports it and finishes nothing): with a rollback pending,
	// the live root may be partly the rollback's target.
	Interrupted *Interrupted `json:"interrupted,omitempty"`
}

// LsEntry is one name in a checkpoint's directory.
//
// The wire form of paths.LsEntry.
type LsEntry struct {
	Name string `json:"name"`
	// NameB64 is the name's raw bytes, base64, when it is not valid UTF-8
	// (Name then holds U+FFFD where the bad bytes were).
	NameB64 string `json:"name_b64,omitempty"`
	// Type is file, dir, symlink, hardlink, fifo, socket, chardev or
	// blockdev. A hardlink shows its primary's metadata; Target names it.
	Type      string    `json:"type"`
	Mode      string    `json:"mode"` // as ls -l prints it: "-rw-r--r--"
	Perm      string    `json:"perm"` // the permission bits in octal: "0644"
	UID       uint32    `json:"uid"`
	GID       uint32    `json:"gid"`
	Size      uint64    `json:"size"`
	Mtime     time.Time `json:"mtime"`
	Xattrs    []string  `json:"xattrs,omitempty"` // names only
	Target    string    `json:"target,omitempty"` // symlink text, or a hardlink's primary ("/path")
	TargetB64 string    `json:"target_b64,omitempty"`
	Rdev      uint64    `json:"rdev,omitempty"`
}

// RestorePathsResult reports a path restore.
//
// The wire form of paths.RestorePathsResult.
type RestorePathsResult struct {
	Sandbox    string         `json:"sandbox"`
	Checkpoint ID             `json:"checkpoint"`
	Target     string         `json:"target"` // the live root, or RestorePathsOptions.To
	Paths      []RestoredPath `json:"paths"`

	DurationMS float64 `json:"duration_ms"`
}

// Lineage is the whole home's history: every sandbox and every checkpoint
// the catalog holds, children always before their parents.
//
// The wire form of history.Lineage.
type Lineage struct {
	Sandboxes   []LineageSandbox `json:"sandboxes"`
	Checkpoints []LineageEntry   `json:"checkpoints"`
}

// ProcessList is what Processes reports.
//
// The wire form of engine.ProcessList.
type ProcessList struct {
	Sandbox string `json:"sandbox"`
	Running bool   `json:"running"` // the sandbox's container runs
	Head    ID     `json:"head"`
	// HeadHasImage says the head checkpoint has a process image at all.
	HeadHasImage bool          `json:"head_has_image"`
	Processes    []ProcessInfo `json:"processes"`
	// Interrupted is what an interrupted operation left (ps reports it and
	// finishes nothing): a pending rollback, or processes a finished
	// rollback could not restore.
	Interrupted *Interrupted `json:"interrupted,omitempty"`
}

// PathChange is one changed path of a diff, described for people and
// scripts.
//
// The wire form of engine.PathChange.
type PathChange struct {
	Change string `json:"change"` // added, modified, deleted
	Path   string `json:"path"`   // "/src/main.go"
	// PathB64 is Path's raw bytes, base64 (standard, padded), when the
	// name is not valid UTF-8; Path then has U+FFFD where the bad bytes were.
	PathB64 string `json:"path_b64,omitempty"`
	Type    string `json:"type"` // the newer entry's type (the older one's for a deletion)
	// OldSize and NewSize are regular files' sizes on each side (absent
	// where the path is not a file on that side).
	OldSize *uint64 `json:"old_size,omitempty"`
	NewSize *uint64 `json:"new_size,omitempty"`
	// Meta lists what changed of a modified entry: type, mode, owner,
	// mtime, xattr (one per attribute), target, rdev, content.
	Meta []MetaChange `json:"meta,omitempty"`
	// Patch is the unified diff of a text file (DiffOptions.Patch), with
	// a/PATH and b/PATH labels (/dev/null for a missing side).
	Patch string `json:"patch,omitempty"`
	// Binary says a patch was asked for but the content is not text (or
	// is too large); the sizes say what changed.
	Binary bool `json:"binary,omitempty"`
}

// Interrupted says what an interrupted operation left on a sandbox, for
// commands that report it rather than finish it (ps, diff, status).
//
// The wire form of engine.Interrupted.
type Interrupted struct {
	// Rollback is the checkpoint an interrupted rollback was moving to:
	// the root may be partly rewritten, the head is still the old one.
	Rollback *ID `json:"rollback,omitempty"`
	// ProcessesLost says why a finished rollback's processes were not
	// restored (the checkpoint's processes do not run).
	ProcessesLost string `json:"processes_lost,omitempty"`
}

// RestoredPath is what happened to one path.
//
// The wire form of paths.RestoredPath.
type RestoredPath struct {
	Path    string `json:"path"` // "/etc/app.conf"
	PathB64 string `json:"path_b64,omitempty"`
	// Action is "restored", "removed" (absent in the checkpoint, so
	// removed from the target) or "absent" (in neither).
	Action string `json:"action"`
	// Entries, Files and Bytes count what was written; Unchanged the
	// entries that already were as in the checkpoint and were left alone.
	Entries   int64 `json:"entries"`
	Files     int64 `json:"files"`
	Bytes     int64 `json:"bytes"`
	Unchanged int64 `json:"unchanged"`
}

// LineageSandbox is one live sandbox of the home in a Lineage.
//
// The wire form of history.LineageSandbox.
type LineageSandbox struct {
	Name string `json:"name"`
	Head ID     `json:"head"`
	// Origin is the checkpoint the sandbox was branched from (zero when it
	// was created from a base), and OriginSandbox the sandbox that took it.
	Origin        ID     `json:"origin"`
	OriginSandbox string `json:"origin_sandbox,omitempty"`
}

// LineageEntry is one checkpoint of the home with the sandboxes that meet
// it.
//
// The wire form of history.LineageEntry.
type LineageEntry struct {
	ID      ID        `json:"id"`
	Parent  ID        `json:"parent"`
	Sandbox string    `json:"sandbox"` // the label of the sandbox that took it on this home
	Removed bool      `json:"removed,omitempty"`
	Turn    int       `json:"turn"`
	Class   Class     `json:"class"`
	Message string    `json:"message,omitempty"`
	Created time.Time `json:"created"`
	// BytesNew is what the checkpoint stored (delta.Stats.BytesNew).
	BytesNew int64 `json:"bytes_new"`
	// Heads are the sandboxes whose head it is.
	Heads []string `json:"heads,omitempty"`
	// Branches are the other sandboxes that continue from it: branched from
	// it, rolled back to it, or with a checkpoint whose parent it is.
	Branches []string `json:"branches,omitempty"`
}

// ProcessInfo is one long-lived process of a sandbox.
//
// The wire form of engine.ProcessInfo.
type ProcessInfo struct {
	PID     int       `json:"pid"`  // inside the sandbox (CRIU keeps it across a restore)
	PPID    int       `json:"ppid"` // 0 when the parent is outside the sandbox's tree
	Command []string  `json:"command"`
	Comm    string    `json:"comm"`
	Started time.Time `json:"started"`
	State   string    `json:"state"` // the kernel's letter: S sleeping, R running...
	Threads int       `json:"threads"`
	// CPUMs is user+system CPU time in milliseconds; RSSBytes the resident set.
	CPUMs    float64 `json:"cpu_ms"`
	RSSBytes int64   `json:"rss_bytes"`
	// InCheckpoint is true when the head checkpoint's process image holds
	// this process (the same pid started at the same instant was there
	// when the image was taken), so a rollback to the head brings it back.
	InCheckpoint bool `json:"in_checkpoint"`
}

// MetaChange is one metadata field that differs between the two sides.
//
// The wire form of engine.MetaChange.
type MetaChange struct {
	Field string `json:"field"`
	Name  string `json:"name,omitempty"` // the xattr's name
	Old   string `json:"old,omitempty"`
	New   string `json:"new,omitempty"`
	// OldB64 and NewB64 carry a symlink target that is not valid UTF-8.
	OldB64 string `json:"old_b64,omitempty"`
	NewB64 string `json:"new_b64,omitempty"`
}

// DiffRequest is GET /v1/sandboxes/{name}/diff (as query parameters).
type DiffRequest struct {
	From  string `json:"from,omitempty"` // "": the head
	To    string `json:"to,omitempty"`   // "": the live root; needs From
	Patch bool   `json:"patch,omitempty"`
}

// RestorePathsRequest is POST /v1/sandboxes/{name}/restore.
type RestorePathsRequest struct {
	Checkpoint string   `json:"checkpoint"`
	Paths      []string `json:"paths"`
	// To is a host directory to write into instead of the sandbox. Only a
	// direct (in-process) service honours it: the daemon refuses it
	// (ErrRestoreToRefused).
	To string `json:"to,omitempty"`
}

// CatErrorTrailer is the trailer a cat response ends with: "none" when the
// whole file was sent, else the problem+json of the error that cut it off.
const CatErrorTrailer = "Turnsnap-Error"

// CatComplete is the trailer of a cat response that sent the whole file.
const CatComplete = "none"

// Describe says what the interrupted operation left on sandbox name, for
// people ("" when nothing).
func (i *Interrupted) Describe(name string) string {
	if i == nil {
		return ""
	}
	var parts []string
	if i.Rollback != nil {
		parts = append(parts, fmt.Sprintf("an interrupted rollback to %s is pending: the root may be partly rewritten "+
			"(the next command that changes the sandbox finishes it; `turnsnap rollback %s --abandon` discards it)", i.Rollback.Short(), name))
	}
	if i.ProcessesLost != "" {
		parts = append(parts, "processes not restored: "+i.ProcessesLost)
	}
	return strings.Join(parts, "; ")
}
