package delta

import "fmt"

// RecordVersionDump is the version of a record that carries the statistics
// CRIU wrote for the dump of its process image (proc_dump, docs/FORMAT.md
// "Record version 5"). It may carry every earlier field too. Records
// without the field keep their version 2, 3 or 4 bytes, and a reader that
// knows only up to 4 refuses these as a newer version rather than drop
// the figures.
const RecordVersionDump = 5

// MaxDumpNs bounds each time in a record's proc_dump: CRIU counts them in
// microseconds in 32 bits, so no real dump reports more than about 72
// minutes; a day leaves room and keeps the sums of a history far from
// overflowing.
const MaxDumpNs = int64(24 * 60 * 60 * 1e9)

// DumpStats are what CRIU measured itself while it dumped a checkpoint's
// process image (its stats-dump file): how long the processes were frozen
// by CRIU, where that time went, and how many pages it looked at and
// wrote. They describe the image named by the record's proc_tree, so a
// record that carries its parent's image forward carries these with it,
// as it carries the image's host facts.
type DumpStats struct {
	// FreezingNs is how long CRIU took to freeze the tasks (about zero when
	// they were frozen already, as turnsnap's cut leaves them).
	FreezingNs int64 `json:"freezing_ns"`
	// FrozenNs is CRIU's frozen_time: from the freeze it made or found to
	// the moment it let the tasks go, the part of a pause spent inside CRIU.
	FrozenNs int64 `json:"frozen_ns"`
	// MemdumpNs is the time spent draining memory out of the tasks,
	// MemwriteNs the time spent writing it into the image.
	MemdumpNs  int64 `json:"memdump_ns"`
	MemwriteNs int64 `json:"memwrite_ns"`
	// PagesScanned are the pages CRIU looked at, PagesWritten the ones it
	// wrote into the image, PagesSkippedParent the ones a parent image
	// already held (always zero here: no soft-dirty tracking).
	PagesScanned       uint64 `json:"pages_scanned"`
	PagesWritten       uint64 `json:"pages_written"`
	PagesSkippedParent uint64 `json:"pages_skipped_parent,omitempty"`
}

// validDump checks a record's proc_dump (its version is checked with the
// other fields'): only with a process image, every time in 0..MaxDumpNs.
func (cp *Checkpoint) validDump() error {
	d := cp.ProcDump
	switch {
	case d == nil:
		return nil
	case cp.ProcTree == nil:
		return fmt.Errorf("record has a proc_dump but no proc_tree")
	}
	for _, ns := range []int64{d.FreezingNs, d.FrozenNs, d.MemdumpNs, d.MemwriteNs} {
		if ns < 0 || ns > MaxDumpNs {
			return fmt.Errorf("proc_dump time %d ns is out of range 0..%d", ns, MaxDumpNs)
		}
	}
	return nil
}
