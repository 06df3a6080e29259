package engine

import "time"

// BranchPhases is where one fan-out (BranchMany, or Branch: a fan-out of
// one) spent its time, phase by phase; every result of the fan-out points
// at the same one. The phases run one after another, so they add up to
// about the whole call; BenchmarkScaleFanout reports them per branch so a
// regression points at its phase.
type BranchPhases struct {
	// Prepare: the checkpoint resolved, the names and host checked, the
	// tree's state checked, the base prepared, the frozen layer readied
	// (waited for or built). Image, Base and Layer are parts of it: the
	// process image read and verified (once for all branches), the base
	// made ready on this host and checked, and the frozen layer readied.
	Prepare, Image, Base, Layer time.Duration
	// Roots: every branch's root made (a mount each when stacked).
	Roots time.Duration
	// Catalog: the sandbox and head objects written, then the one catalog
	// transaction that records every branch.
	Catalog time.Duration
	// Files: every branch's files receipt (a scan of its root, or the
	// frozen layer's proof and a check that the root is mounted).
	Files time.Duration
	// Processes: every branch's processes restored by CRIU, their
	// baseline taken and their receipt checked.
	Processes time.Duration
}

// lap returns the time since *t and moves *t to now.
func lap(t *time.Time) time.Duration {
	now := time.Now()
	d := now.Sub(*t)
	*t = now
	return d
}
