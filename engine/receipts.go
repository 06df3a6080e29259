package engine

import (
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/receipt"
	"github.com/turnsnap/turnsnap/internal/rootfs"
)

// Restore receipts (engine/receipt): every rollback and branch checks what
// it made against the checkpoint and returns the check.

// The receipt's types, under the names the engine's callers use.
type (
	Receipt                = receipt.Receipt
	FilesReceipt           = receipt.FilesReceipt
	ProcessReceipt         = receipt.ProcessReceipt
	RestoreIncompleteError = receipt.RestoreIncompleteError
)

// PhaseReceiptFiles and PhaseReceiptProcesses are the receipt's phases
// (receipt.PhaseFiles, receipt.PhaseProcesses).
const (
	PhaseReceiptFiles     = receipt.PhaseFiles
	PhaseReceiptProcesses = receipt.PhaseProcesses
)

// newReceipts makes the engine's receipt checker.
func newReceipts(e *Engine, o receipt.Options) *receipt.Checker {
	return receipt.New(receipt.Deps{
		Log: e.log, Phase: e.phase, Procs: e.procs,
		Loader:   func() delta.BlobLoader { return e.data.repo },
		Scanners: func() []rootfs.TurnScanner { return implementing[rootfs.TurnScanner](e.backends) },
	}, o)
}
