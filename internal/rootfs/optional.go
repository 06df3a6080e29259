package rootfs

import (
	"context"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
)

// Optional interfaces: what a backend may do beyond Backend, each asked
// for where it is used (`if f, ok := backend.(rootfs.Freezer); ok`). A
// backend implements those that apply to it; the engine does without the
// others. The backend owns the policy and its state behind each one.

// Freezer is a backend that keeps committed checkpoints' layers read-only
// on this host (overlay's frozen layers), so that a branch stacks on one
// instead of copying it. Which layers it keeps, and when it builds them
// (in the background, after the turn), is its own policy.
type Freezer interface {
	// TurnStarted counts a checkpoint in flight until done is called:
	// background freezes wait while turns run.
	TurnStarted() (done func())
	// FreezeLater queues the freeze of cp, just committed in sandbox,
	// whose head was parent (the parent checkpoint's fs tree; zero for
	// none).
	FreezeLater(sandbox string, parent delta.ID, cp *delta.Checkpoint)
	// PrepareBranch makes sure cp's layer exists for branches about to be
	// made of it (size: its tree's bytes, what a build from nothing
	// writes), and reports whether they will stack on it.
	PrepareBranch(ctx context.Context, cp *delta.Checkpoint, size uint64) (bool, error)
	// StackBranch lays out a new root in dir on lower dir base whose state
	// is cp's, stacked on cp's layer (no file copied), and mounts it. It
	// fails with errdefs.ErrNotFound when this host keeps no layer of cp:
	// the caller then creates the root (Backend.Create).
	StackBranch(ctx context.Context, dir, base string, cp *delta.Checkpoint) (Root, error)
	// PruneFrozen removes the layers no retention rule keeps any more
	// (after gc, prune and sandbox removal).
	PruneFrozen(ctx context.Context) error
	// WaitFreezes waits until no background freeze is pending.
	WaitFreezes()
	// VerifyFrozen re-hashes this host's layer of tree, if it keeps one,
	// and reports whether it did.
	VerifyFrozen(ctx context.Context, tree delta.ID) (bool, error)
}

// TurnScanner is a backend that scans a sandbox's root for a turn better
// than Root.Scan: through a record of what changed since the last turn
// (overlay's change trackers), reading again the files whose changes may
// leave no sign.
type TurnScanner interface {
	// ScanTurn scans sandbox's root for a checkpoint, like Root.Scan.
	// reread names root-relative files to read whatever their stat says
	// (files a process maps shared and writable). The TurnScan settles
	// the scan once the turn is decided.
	ScanTurn(ctx context.Context, sandbox string, root Root, reread []string, saver delta.BlobSaver) (*fstree.ScanResult, TurnScan, error)
	// ScanRestored scans root through the record a restore left on it (a
	// rollback's receipt); ok is false when there is none.
	ScanRestored(ctx context.Context, sandbox string, root Root, saver delta.BlobSaver) (res *fstree.ScanResult, ok bool, err error)
	// Untrack forgets sandbox's record: its root is about to be
	// unmounted, restored or removed, and the next turn must walk.
	Untrack(sandbox string)
	// TrackingStats counts what the records did, for the daemon's metrics.
	TrackingStats() TrackingStats
}

// TurnScan settles one turn's scan (TurnScanner.ScanTurn).
type TurnScan interface {
	// Committed records res as the root's committed scan once the
	// checkpoint holding it is durable (Root.Committed, which it may
	// defer); an error only costs re-reads.
	Committed(res *fstree.ScanResult) error
	// Skipped settles a turn that committed nothing (head: the head's fs
	// tree).
	Skipped(res *fstree.ScanResult, head delta.ID)
	// Failed settles a turn that failed; after Committed or Skipped it
	// does nothing (so it can be deferred).
	Failed()
}

// TrackingStats counts what change tracking did, for the daemon's metrics.
type TrackingStats struct {
	// TrackedScans counts turns decided from the change record, without a
	// walk; UnchangedTurns those of them whose record was empty (nothing
	// was read or listed).
	TrackedScans   uint64
	UnchangedTurns uint64
	// PathsScanned totals the changed paths tracked scans were given.
	PathsScanned uint64
	// Walks counts turns that fell back to the full incremental walk, by
	// reason (start, overflow, read, unresolved, too-many, lost, hardlink,
	// remount, start-failed).
	Walks map[string]uint64
	// Overflows counts kernel event-queue overflows (FAN_Q_OVERFLOW);
	// Events the events read; StartFailures trackers that could not start.
	Overflows     uint64
	Events        uint64
	StartFailures uint64
}

// Rollbacker is a backend whose rollbacks restore a root better than
// Root.Restore: from the live state its change record gives, leaving a
// new record on the restored root, and saying how they went.
type Rollbacker interface {
	// BeginRollback prepares the rollback of sandbox's root before its
	// processes stop; mapped returns the root-relative files its running
	// processes map shared and writable (nil when none run), whose
	// stores make no change event.
	BeginRollback(ctx context.Context, sandbox string, root Root, mapped func(context.Context) ([]string, error)) Rollback
}

// Rollback is one prepared rollback (Rollbacker.BeginRollback).
type Rollback interface {
	// Restore makes the root cp's state, as Root.Restore does.
	// beforeWrite runs before the root's first write (an error from it
	// fails the restore unwritten).
	Restore(ctx context.Context, cp *delta.Checkpoint, loader delta.BlobLoader, beforeWrite func() error) (RestoreInfo, error)
	// Abort drops what BeginRollback held, for a rollback that stops
	// before its restore.
	Abort()
}

// RestoreInfo says how a Rollback's restore went.
type RestoreInfo struct {
	// Live is how the live state was found: "tracked", "walk", or the
	// reason a change record could not be used ("": not restored by diff).
	Live string
	// Fallback is why the layer was rebuilt whole ("": restored by diff).
	Fallback string
	// Mounted says the diff was written through the mounted root, which
	// stayed mounted.
	Mounted bool
	// Verified is the layer tree the restore proved it wrote (zero:
	// nothing proved).
	Verified delta.ID
}
