package engine

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"github.com/turnsnap/turnsnap/overlay"
	"github.com/turnsnap/turnsnap/proc"
)

// Restore receipts (issue 24). A restore that "succeeds" with a file or a
// process missing is worse than one that fails: the agent goes on from a
// state nobody took. So every rollback and branch (a branch on another
// host from the store, the off-host restore, included) ends with a check
// of what it made, against the checkpoint, done after everything else
// (files, then processes), and returns it as a Receipt: in the result, in
// --json, in the API's answer and in the event. Any difference fails the
// restore with errdefs.ErrRestoreIncomplete (RestoreIncompleteError, which
// names the state the sandbox was left in); it never reads as success.
//
// Files. The restores verify what they write already: an overlay diff
// restore reads back every name it wrote and lists every directory it
// changed (delta.DiffPlan.Verify), a rebuild re-hashes the whole new layer,
// a btrfs restore re-derives the layer from a scan or snapshots a restore
// point whose head names the tree. What none of them sees is the root as
// the sandbox sees it once the restore is over: the mount switched in, the
// stack of a branch, and what a process restore did to it. The receipt's
// check is one scan of that root (Root.Scan), which re-reads no content the
// restore just hashed: the restore left the scan's cache (overlay) or scan
// state (btrfs) behind, so the scan stats the layer and hashes trees. The
// layer tree it finds must be the checkpoint's, or describe the same state
// over the base (another backend's layer; delta.Diff finds no change), with
// only the socket-mtime noise a process restore makes (restoreturn.go).
// The same scan is the one a process restore's acceptRestored needs, so a
// restore with processes scans once, as before.
//
// Processes. The image's inventory is read from CRIU's own files
// (pstree.img, core-PID.img, files.img: pids, command names, listening TCP
// sockets); the restored container's from /proc. They must be equal:
// every process of the image by pid and command, no other, and every
// socket listening that listened.

// NotRestored is what a restore deliberately does not bring back
// (docs/PROCESSES.md, "What a checkpoint captures"); every receipt lists it.
var notRestored = []string{
	"TCP connections to peers outside the sandbox (its network is its own loopback; a process must reconnect)",
	"host pids (pids inside the sandbox are the image's; host pids are new)",
	"anything outside the sandbox's container (the network namespace is recreated with loopback up)",
}

// NotRestored returns the documented list every receipt carries.
func NotRestored() []string { return append([]string(nil), notRestored...) }

// Receipt is a restore's proof of what it made (see above).
type Receipt struct {
	Kind       string       `json:"kind"` // rollback or branch
	Sandbox    string       `json:"sandbox"`
	Checkpoint delta.ID     `json:"checkpoint"`
	OK         bool         `json:"ok"`
	Files      FilesReceipt `json:"files"`
	// Processes is nil when no processes were restored (the checkpoint
	// has none, or --fs-only).
	Processes   *ProcessReceipt `json:"processes,omitempty"`
	NotRestored []string        `json:"not_restored"`
	// Check is how long the receipt's own check took (the scan and the
	// process inventories), the cost a restore pays for it.
	Check time.Duration `json:"check_ns"`
}

// FilesReceipt compares the restored root with the checkpoint's tree.
type FilesReceipt struct {
	// Want is the checkpoint's layer tree; Got the layer tree a scan of
	// the restored root found (equal, or the same state over the base).
	Want delta.ID `json:"want"`
	Got  delta.ID `json:"got"`
	// WantState and GotState are the state keys (docs/FORMAT.md).
	WantState delta.ID `json:"want_state"`
	GotState  delta.ID `json:"got_state"`
	// Written says how the restore verified what it wrote.
	Written string `json:"written"`
	// Noise is a difference accepted as the process restore's own (a
	// socket node's mtime: restoreturn.go).
	Noise string `json:"noise,omitempty"`
	// Mismatch names the first difference; empty when Match.
	Mismatch string `json:"mismatch,omitempty"`
	Match    bool   `json:"match"`
}

// ProcessReceipt compares the restored container with the image.
type ProcessReceipt struct {
	Want    proc.Inventory `json:"want"`
	Got     proc.Inventory `json:"got"`
	Missing []string       `json:"missing,omitempty"`
	// Churn is what the restored processes did themselves between the
	// restore and the look (a shell's short-lived child exited or
	// started: proc.Inventory.Compare); no failure.
	Churn []string `json:"churn,omitempty"`
	Match bool     `json:"match"`
}

// RestoreIncompleteError is a restore whose receipt found a difference.
type RestoreIncompleteError struct {
	Receipt *Receipt
	// State is what the sandbox was left as.
	State string
}

func (e *RestoreIncompleteError) Error() string {
	r := e.Receipt
	var what []string
	if !r.Files.Match {
		what = append(what, "files: "+r.Files.Mismatch)
	}
	if r.Processes != nil && !r.Processes.Match {
		what = append(what, "processes: "+strings.Join(r.Processes.Missing, "; "))
	}
	return fmt.Sprintf("sandbox %s: %s to %s: %s; left %s: %v", r.Sandbox, r.Kind, r.Checkpoint.Short(),
		strings.Join(what, "; "), e.State, errdefs.ErrRestoreIncomplete)
}

func (e *RestoreIncompleteError) Unwrap() error { return errdefs.ErrRestoreIncomplete }

// PhaseReceipt is reached after a restore (files and processes) and before
// its receipt's check: tests change the sandbox there.
const PhaseReceipt = "restore: receipt"

// writtenHow describes how a restore verified what it wrote.
func writtenHow(root rootfs.Root, info overlay.RestoreInfo, stacked bool) string {
	switch {
	case stacked:
		return "stacked on the frozen layer (re-hashed when frozen)"
	case info.Fallback != "":
		return "layer rebuilt and re-hashed whole (" + info.Fallback + ")"
	case info.Live != "":
		return "diff written, every name written read back and hashed, changed directories listed"
	}
	if _, ok := root.(*overlay.Root); ok {
		return "layer rebuilt and re-hashed whole"
	}
	return "layer re-derived by a scan, or a restore point naming the tree"
}

// receipt checks a finished restore of cp onto root (its processes too,
// from the image in img, when procs) and returns the receipt. With
// procs it also records the state a process restore leaves for the next
// turn (acceptRestored). It never fails by itself: what it cannot check
// is a mismatch.
func (e *Engine) receipt(ctx context.Context, kind, name string, root rootfs.Root, cp *delta.Checkpoint, written, img string, procs bool) *Receipt {
	e.phase(PhaseReceipt)
	start := time.Now()
	rc := &Receipt{Kind: kind, Sandbox: name, Checkpoint: cp.ID, NotRestored: NotRestored(),
		Files: FilesReceipt{Want: cp.FSTree, WantState: cp.StateKey, Written: written}}
	e.filesReceipt(ctx, name, root, cp, procs, &rc.Files)
	if procs {
		rc.Processes = e.processReceipt(ctx, name, img)
	}
	rc.OK = rc.Files.Match && (rc.Processes == nil || rc.Processes.Match)
	rc.Check = time.Since(start)
	return rc
}

// filesReceipt scans root and compares it with cp (see above).
func (e *Engine) filesReceipt(ctx context.Context, name string, root rootfs.Root, cp *delta.Checkpoint, procs bool, f *FilesReceipt) {
	if procs {
		os.Remove(e.home.restoredFile(name))
	}
	trees := &treeMemo{next: e.repo, trees: map[delta.ID][]byte{}}
	res, err := root.Scan(ctx, trees)
	if err != nil {
		f.Mismatch = "the restored root does not scan: " + err.Error()
		return
	}
	f.Got, f.GotState = res.Root, res.StateKey
	if res.Root == cp.FSTree || (cp.StateKey != delta.ID{} && res.StateKey == cp.StateKey) {
		f.Match = true
		if procs {
			// The checkpoint's state exactly: the scan is the next turn's
			// base (restoreturn.go).
			if err := root.Committed(res); err != nil {
				e.log.Warn("scan cache after process restore", "sandbox", name, "err", err)
			}
		}
		return
	}
	// Another backend's layer for the same state, or a process restore's
	// socket noise: the merged states must agree.
	ok, why, err := onlyRestoreNoise(ctx, trees, cp, res.Root)
	if err != nil {
		f.Mismatch = fmt.Sprintf("layer %s: %v", res.Root.Short(), err)
		return
	}
	if !ok {
		f.Mismatch = why
		return
	}
	f.Match = true
	if procs {
		f.Noise = "socket nodes' mtimes (CRIU binds them anew)"
		data := cp.ID.String() + " " + res.StateKey.String() + "\n"
		if err := os.WriteFile(e.home.restoredFile(name), []byte(data), 0o600); err != nil {
			e.log.Warn("record restored state", "sandbox", name, "err", err)
		}
	}
}

// processReceipt compares the sandbox's running container with the image.
func (e *Engine) processReceipt(ctx context.Context, name, img string) *ProcessReceipt {
	pr := &ProcessReceipt{}
	want, err := proc.ImageInventory(img)
	if err != nil {
		pr.Missing = []string{"the image's inventory does not read: " + err.Error()}
		return pr
	}
	pr.Want = want
	rt, err := e.runtime(ctx)
	if err == nil {
		pr.Got, err = rt.Inventory(ctx, e.home.containerID(name))
	}
	if err != nil {
		pr.Missing = []string{"the container's processes do not read: " + err.Error()}
		return pr
	}
	pr.Missing, pr.Churn = want.Compare(pr.Got)
	pr.Match = len(pr.Missing) == 0
	return pr
}

// failReceipt leaves a sandbox whose receipt found a difference in a
// state nothing runs on and returns the error naming it: its processes
// are stopped (they would run on files, or beside processes, that are not
// the checkpoint's), its head is cp, its root as the receipt found it.
func (e *Engine) failReceipt(ctx context.Context, rc *Receipt) error {
	state := fmt.Sprintf("with head %s", rc.Checkpoint.Short())
	if rc.Files.Match {
		state += ", its files the checkpoint's"
	} else {
		state += ", its root as found (the next checkpoint records it)"
	}
	if rc.Processes != nil {
		if err := e.stopProcesses(context.WithoutCancel(ctx), rc.Sandbox); err != nil {
			state += ", its processes not stopped (" + err.Error() + ")"
		} else {
			state += ", no process running"
		}
	}
	e.log.Warn("restore incomplete", "sandbox", rc.Sandbox, "kind", rc.Kind, "checkpoint", rc.Checkpoint.Short(),
		"files", rc.Files.Match, "mismatch", rc.Files.Mismatch)
	return &RestoreIncompleteError{Receipt: rc, State: state}
}
