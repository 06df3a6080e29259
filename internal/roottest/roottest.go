// Package roottest is the conformance suite every sandbox-root backend
// passes, in the manner of containerd's snapshotter testsuite: the engine
// runs Run once per backend (overlay, btrfs), so every behaviour the engine
// relies on is checked against each of them with the same tests.
//
// The interfaces below are structurally identical to engine.Root and
// engine.Backend; the package imports nothing from engine, so a backend
// under test needs only a small adapter converting its Root type.
package roottest

import (
	"context"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
)

// Root is one sandbox's root filesystem (see engine.Root for the contract).
type Root interface {
	Path() string
	Mount(ctx context.Context) error
	Unmount(ctx context.Context) error
	Remove(ctx context.Context) error
	Scan(ctx context.Context, saver delta.BlobSaver) (*delta.ScanResult, error)
	Committed(res *delta.ScanResult) error
	Restore(ctx context.Context, tree delta.ID, loader delta.BlobLoader) error
}

// Backend makes roots of one kind (see engine.Backend).
type Backend interface {
	Name() string
	PrepareBase(ctx context.Context, tree delta.ID, loader delta.BlobLoader) (string, error)
	Create(ctx context.Context, dir, base string, tree delta.ID, loader delta.BlobLoader) (Root, error)
	Open(dir, base string) Root
}

// Setup is one backend under test, made fresh for each test.
type Setup struct {
	Backend Backend
	// Leftovers lists what removed roots left on the host outside their
	// directories (subvolumes, restore points); nil skips that check.
	Leftovers func() ([]string, error)
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
		{"RemoveCleansEverything", testRemoveCleans},
		{"DirectoryRenames", testDirRenames},
		{"LongPaths", testLongPaths},
		{"ScanRacingSymlinkSwap", testScanRacingSymlinkSwap},
		{"RandomEditsWithRenames", testRandomEdits},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t)
			tc.fn(t, s)
		})
	}
}
