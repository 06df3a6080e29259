// Package roottest is the conformance suite every sandbox-root backend
// passes, in the manner of containerd's snapshotter testsuite: the engine
// runs Run once per backend (overlay, btrfs), so every behaviour the engine
// relies on is checked against each of them with the same tests.
//
// Backends implement rootfs.Backend directly; the suite needs nothing else.
package roottest

import (
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/rootfs"
)

// Setup is one backend under test, made fresh for each test.
type Setup struct {
	Backend rootfs.Backend
	// Leftovers lists what removed roots left on the host outside their
	// directories (subvolumes, restore points); nil skips that check.
	Leftovers func() ([]string, error)
	// IDs is the content ID scheme Backend was made with (zero: plain
	// BLAKE3); the suite's store and trees use it too.
	IDs delta.IDs
}

// Run runs every conformance test against the backend newSetup makes.
// newSetup is called once per test and may skip or fail it when a part
// the backend needs is missing (testenv.Missing).
func Run(t *testing.T, newSetup func(t *testing.T) Setup) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s Setup)
	}{
		{"Lifecycle", testLifecycle},
		{"ScanCapturesEveryChange", testScanCapturesEveryChange},
		{"ScanLayerForm", testScanLayerForm},
		{"UnchangedTurnsKeepStateKey", testUnchangedTurns},
		{"IncrementalScanReadsOnlyChanged", testIncremental},
		{"RestoreEarlierTrees", testRestoreEarlierTrees},
		{"RestoreIntoNewRoot", testRestoreIntoNewRoot},
		{"RestoreCorruptTreeKeepsState", testRestoreCorrupt},
		{"RollbackKeepsInodes", testRollbackKeepsInodes},
		{"RemoveCleansEverything", testRemoveCleans},
		{"DirectoryRenames", testDirRenames},
		{"LongPaths", testLongPaths},
		{"ScanRacingSymlinkSwap", testScanRacingSymlinkSwap},
		{"RandomEditsWithRenames", testRandomEdits},
		{"SparseFiles", testSparseFiles},
		{"LargeTurn", testLargeTurn},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t)
			tc.fn(t, s)
		})
	}
}
