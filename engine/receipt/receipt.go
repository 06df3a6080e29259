// Package receipt checks what a restore made against the checkpoint it
// restored, and accepts the traces a process restore leaves on the files.
package receipt

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/procs"
	"github.com/turnsnap/turnsnap/engine/statememo"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"github.com/turnsnap/turnsnap/proc"
	"golang.org/x/sys/unix"
)

// Restore receipts (issue 24). A restore that "succeeds" with a file or a
// process missing is worse than one that fails: the agent goes on from a
// state nobody took. So every rollback and branch (a branch on another
// host from the store, the off-host restore, included) checks what it
// made against the checkpoint and returns the check as a Receipt: in the
// result, in --json, in the API's answer and in the event. The files are
// checked once they are all in place and before any process runs on them
// (a restored process goes on writing at once: its files are its own from
// then on); the processes once they run. A file difference fails the
// restore before its processes start. Any difference fails it with
// errdefs.ErrRestoreIncomplete (RestoreIncompleteError, which names the
// state the sandbox was left in); it never reads as success.
//
// Files. The restores verify what they write already: an overlay diff
// restore reads back every name it wrote and lists every directory it
// changed (fstree.DiffPlan.Verify), a rebuild re-hashes the whole new layer,
// a btrfs restore re-derives the layer from a scan or snapshots a restore
// point whose head names the tree. The receipt builds on that proof
// instead of hashing twice: the tree it proved (overlay's
// RestoreInfo.Verified, btrfs's Root.Restored) must be the checkpoint's,
// or describe the same state over the base (another backend's layer;
// delta.Diff finds no change). What the proof does not see is the root as
// the sandbox sees it once the restore is over. With the daemon's change
// tracker on the restored overlay root, a tracked scan reads what was
// written since the proof (a few paths, or none); without one the root
// must be the mount of what was proven (mountedRoot). A scan of the whole
// root (a 2,000-file layer: 25 ms of a 100 ms rollback, measured) is left
// to branches, whose roots Create made without reporting a proof.
//
// Processes. The image's inventory is read from CRIU's own files
// (pstree.img, core-PID.img, files.img: pids, command names, listening TCP
// sockets); the restored container's from /proc. They must be equal:
// every process of the image by pid and command, no other, and every
// socket listening that listened.

// Deps is what the receipts need of the engine.
type Deps struct {
	Log *slog.Logger
	// Loader returns what restores read from (the engine's content repo,
	// which a catalog rebuild or a new remote replaces).
	Loader func() delta.BlobLoader
	// Scanners returns the backends that scan a restored root through
	// the record its restore left (rootfs.TurnScanner).
	Scanners func() []rootfs.TurnScanner
	Phase    func(string)
	Procs    Processes
}

// Processes is what the receipts need of the sandboxes' containers
// (procs.Manager).
type Processes interface {
	Restore(ctx context.Context, c procs.Container, root, img string, cp *delta.Checkpoint) error
	Inventory(ctx context.Context, name string) (proc.Inventory, error)
	Stop(ctx context.Context, c procs.Container) error
	Container(name delta.SandboxName) procs.Container
	// RestoredFile is where the state accepted after a process restore
	// is kept (restored.go).
	RestoredFile(name string) string
}

// Options configures a Checker.
type Options struct {
	// Unchecked leaves a restore's receipt unchecked: only the receipt's
	// benchmark sets it, for its baseline (BenchmarkRollbackReceipt).
	Unchecked bool
}

// Checker makes the receipts of a home's restores.
type Checker struct {
	d Deps
	o Options
}

// New returns a Checker.
func New(d Deps, o Options) *Checker { return &Checker{d: d, o: o} }

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
	// Written says how the restore verified what it wrote; Checked how
	// the receipt checked the root afterwards.
	Written string `json:"written"`
	Checked string `json:"checked"`
	// Noise is a difference accepted as no difference of state (a socket
	// node's mtime: restoreturn.go).
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

// PhaseFiles is reached once a restore's files are in place, before
// the receipt checks them; PhaseReceiptProcesses once its processes run,
// before it checks them. Tests change the sandbox there.
const (
	PhaseFiles     = "restore: receipt files"
	PhaseProcesses = "restore: receipt processes"
)

// WrittenHow describes how a restore verified what it wrote.
func WrittenHow(root rootfs.Root, info rootfs.RestoreInfo, stacked bool) string {
	switch {
	case stacked:
		return "stacked on the frozen layer (re-hashed when frozen)"
	case info.Fallback != "":
		return "layer rebuilt and re-hashed whole (" + info.Fallback + ")"
	case info.Live != "":
		return "diff written, every name written read back and hashed, changed directories listed"
	}
	if _, ok := root.(restorePointRoot); ok {
		return "layer re-derived by a scan, or a restore point naming the tree"
	}
	return "layer rebuilt and re-hashed whole"
}

// Check checks the files of a restore of cp onto root, then, if they
// match and procs, restores cp's processes from the image in img and
// checks them; processes says whether they were restored. An error is a
// process restore that failed (the receipt is then nil); a difference is
// a receipt that is not OK.
func (c *Checker) Check(ctx context.Context, kind, name string, root rootfs.Root, cp *delta.Checkpoint, written string, verified delta.ID, img string, procs bool) (*Receipt, bool, error) {
	rc := c.Files(ctx, kind, name, root, cp, written, verified)
	processes, err := c.Processes(ctx, rc, root, cp, img, procs)
	if err != nil {
		return nil, false, err
	}
	return rc, processes, nil
}

// Files is Check's first half: the files, before any process.
func (c *Checker) Files(ctx context.Context, kind, name string, root rootfs.Root, cp *delta.Checkpoint, written string, verified delta.ID) *Receipt {
	c.d.Phase(PhaseFiles)
	start := time.Now()
	rc := &Receipt{Kind: kind, Sandbox: name, Checkpoint: cp.ID, NotRestored: NotRestored(),
		Files: FilesReceipt{Want: cp.FSTree, WantState: cp.StateKey, Written: written}}
	if c.o.Unchecked {
		rc.Files.Match, rc.Files.Mismatch = true, "unchecked (the receipt benchmark's baseline)"
	} else {
		c.filesReceipt(ctx, name, root, cp, verified, &rc.Files)
	}
	rc.Check = time.Since(start)
	rc.OK = rc.Files.Match
	return rc
}

// Processes is Check's second half: with procs and the files
// matching, the processes restored and checked.
func (c *Checker) Processes(ctx context.Context, rc *Receipt, root rootfs.Root, cp *delta.Checkpoint, img string, procs bool) (bool, error) {
	if !procs || !rc.Files.Match {
		return false, nil
	}
	if err := c.d.Procs.Restore(ctx, c.d.Procs.Container(delta.SandboxName(rc.Sandbox)), root.Path(), img, cp); err != nil {
		return false, err
	}
	c.AcceptRestored(ctx, rc.Sandbox, root, cp) // restored.go
	c.d.Phase(PhaseProcesses)
	start := time.Now()
	rc.Processes = c.processReceipt(ctx, rc.Sandbox, img)
	rc.Check += time.Since(start)
	rc.OK = rc.Files.Match && rc.Processes.Match
	return true, nil
}

// filesReceipt compares the restored root with cp (see above). verified
// is the layer tree the restore proved it wrote (zero: none).
func (c *Checker) filesReceipt(ctx context.Context, name string, root rootfs.Root, cp *delta.Checkpoint, verified delta.ID, f *FilesReceipt) {
	trees := statememo.NewTrees(c.d.Loader())
	var res *fstree.ScanResult
	var err error
	tracked := false
	for _, ts := range c.d.Scanners() {
		if res, tracked, err = ts.ScanRestored(ctx, name, root, trees); tracked {
			break
		}
	}
	switch {
	case tracked:
		f.Checked = "tracked scan of the mounted root"
	case verified == cp.FSTree:
		// The restore's own proof, and the root the sandbox sees is the
		// mount of what it proved. (A proof of another layer for the same
		// state, btrfs re-deriving an overlay checkpoint, names trees the
		// store lacks: the scan below finds them for the comparison.)
		f.Checked = "the restore's verification; the root mounted"
		if why := mountedRoot(root); why != "" {
			f.Mismatch = why
			return
		}
		res = &fstree.ScanResult{Root: verified}
	default:
		f.Checked = "scan of the mounted root"
		res, err = root.Scan(ctx, trees)
	}
	if err != nil {
		f.Mismatch = "the restored root does not scan: " + err.Error()
		return
	}
	f.Got, f.GotState = res.Root, res.StateKey
	if res.Root == cp.FSTree || (cp.StateKey != delta.ID{} && res.StateKey == cp.StateKey) {
		f.Match = true
		return
	}
	// Another layer for the same state (another backend's, or one holding
	// copies of base files a rollback wrote back through the mount,
	// fstree's diffbase.go): the merged states must agree
	// (OnlyRestoreNoise with no change at all).
	ok, why, err := OnlyRestoreNoise(ctx, trees, cp, res.Root)
	switch {
	case err != nil:
		f.Mismatch = fmt.Sprintf("layer %s: %v", res.Root.Short(), err)
	case !ok:
		f.Mismatch = why
	default:
		f.Match = true
		f.Noise = "another layer of the same merged state; at most socket nodes' mtimes differ"
	}
}

// mountedRoot says why root's path is not the root a restore left
// mounted ("" when it is): it must be a mount's root, of the backend's
// filesystem (an overlay, or a bind of the btrfs generation). A restore
// that proved its layer and then left the sandbox an empty directory, or
// a stale mount, is the "succeeded with files missing" this catches for
// the price of two system calls.
func mountedRoot(root rootfs.Root) string {
	p := root.Path()
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS, &stx); err != nil {
		return fmt.Sprintf("the root %s: %v", p, err)
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return fmt.Sprintf("the root %s is not mounted", p)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(p, &fs); err != nil {
		return fmt.Sprintf("the root %s: %v", p, err)
	}
	want, name := int64(unix.OVERLAYFS_SUPER_MAGIC), "overlay"
	if _, ok := root.(restorePointRoot); ok {
		want, name = unix.BTRFS_SUPER_MAGIC, "btrfs"
	}
	if int64(fs.Type) != want {
		return fmt.Sprintf("the root %s is not an %s mount (filesystem type %#x)", p, name, fs.Type)
	}
	return ""
}

// restorePointRoot is a root whose restores re-derive its layer from a
// restore point of its filesystem (btrfs's generations), which it names.
type restorePointRoot interface{ Restored() (delta.ID, error) }

// RestoredTree is the layer tree a restore onto root proved (zero: none
// known): overlay's RestoreInfo, btrfs's live generation.
func RestoredTree(root rootfs.Root, info rootfs.RestoreInfo) delta.ID {
	if b, ok := root.(restorePointRoot); ok {
		id, _ := b.Restored()
		return id
	}
	return info.Verified
}

// processReceipt compares the sandbox's running container with the image.
func (c *Checker) processReceipt(ctx context.Context, name, img string) *ProcessReceipt {
	pr := &ProcessReceipt{}
	want, err := proc.ImageInventory(img)
	if err != nil {
		pr.Missing = []string{"the image's inventory does not read: " + err.Error()}
		return pr
	}
	pr.Want = want
	if pr.Got, err = c.d.Procs.Inventory(ctx, name); err != nil {
		pr.Missing = []string{"the container's processes do not read: " + err.Error()}
		return pr
	}
	pr.Missing, pr.Churn = want.Compare(pr.Got)
	pr.Match = len(pr.Missing) == 0
	return pr
}

// Fail leaves a sandbox whose receipt found a difference in a
// state nothing runs on and returns the error naming it: its processes
// are stopped (they would run on files, or beside processes, that are not
// the checkpoint's), its head is cp, its root as the receipt found it.
func (c *Checker) Fail(ctx context.Context, rc *Receipt) error {
	state := fmt.Sprintf("with head %s", rc.Checkpoint.Short())
	if rc.Files.Match {
		state += ", its files the checkpoint's"
	} else {
		state += ", its root as found (the next checkpoint records it)"
	}
	if err := c.d.Procs.Stop(context.WithoutCancel(ctx), c.d.Procs.Container(delta.SandboxName(rc.Sandbox))); err != nil {
		state += ", its processes not stopped (" + err.Error() + ")"
	} else {
		state += ", no process running"
	}
	c.d.Log.Warn("restore incomplete", "sandbox", rc.Sandbox, "kind", rc.Kind, "checkpoint", rc.Checkpoint.Short(),
		"files", rc.Files.Match, "mismatch", rc.Files.Mismatch)
	return &RestoreIncompleteError{Receipt: rc, State: state}
}
