package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/receipt"
	"github.com/turnsnap/turnsnap/internal/rootfs"
)

// restoreWorkers bounds the process restores of one fan-out that run at
// once. A restore is mostly CPU (runc, then CRIU: its kernel probe, the
// container's mounts, the processes) with short waits (runc waiting for
// CRIU, the settle gaps of the baseline), so one more than the cores keeps
// them busy. Measured (BenchmarkScaleFanout, 16 branches, 2 cores): 1
// worker 14.3 s, 3 workers 6.5 s, 8 workers 6.4 s, at a load of 39-41.
func restoreWorkers() int { return runtime.GOMAXPROCS(0) + 1 }

// restoreBranchProcesses restores and checks, with rc, the processes of
// every branch whose files matched (receipt.Checker.Processes), side by
// side: each branch is its own container (its own pid, mount and network
// namespaces, its own runc state and work directory), and all read the one
// image img, read and verified once by BranchMany. Every branch is tried;
// the error joins those that failed, each naming its sandbox, which is
// left with the checkpoint's files and no process.
func restoreBranchProcesses(ctx context.Context, rc *receipt.Checker, out []*RestoreResult, roots []rootfs.Root, cp *delta.Checkpoint, img string, procs bool) error {
	if !procs {
		return nil
	}
	errs := make([]error, len(out))
	parallelN(len(out), restoreWorkers(), func(i int) {
		var err error
		if out[i].Processes, err = rc.Processes(ctx, out[i].Receipt, roots[i], cp, img, procs); err != nil {
			errs[i] = fmt.Errorf("sandbox %s created with the files of %s, processes not: %w", out[i].Sandbox, cp.ID.Short(), err)
		}
	})
	return errors.Join(errs...)
}
