package api

import "time"

// Receipt is a restore's proof of what it made (see above).
//
// The wire form of engine.Receipt.
type Receipt struct {
	Kind       string       `json:"kind"` // rollback or branch
	Sandbox    string       `json:"sandbox"`
	Checkpoint ID           `json:"checkpoint"`
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
//
// The wire form of engine.FilesReceipt.
type FilesReceipt struct {
	// Want is the checkpoint's layer tree; Got the layer tree a scan of
	// the restored root found (equal, or the same state over the base).
	Want ID `json:"want"`
	Got  ID `json:"got"`
	// WantState and GotState are the state keys (docs/FORMAT.md).
	WantState ID `json:"want_state"`
	GotState  ID `json:"got_state"`
	// Written says how the restore verified what it wrote; Checked how
	// the receipt checked the root afterwards.
	Written string `json:"written"`
	Checked string `json:"checked"`
	// Noise is a difference accepted as no difference of state (a socket
	// node's mtime: engine/receipt/restored.go).
	Noise string `json:"noise,omitempty"`
	// Mismatch names the first difference; empty when Match.
	Mismatch string `json:"mismatch,omitempty"`
	Match    bool   `json:"match"`
}

// ProcessReceipt compares the restored container with the image.
//
// The wire form of engine.ProcessReceipt.
type ProcessReceipt struct {
	Want    Inventory `json:"want"`
	Got     Inventory `json:"got"`
	Missing []string  `json:"missing,omitempty"`
	// Churn is what the restored processes did themselves between the
	// restore and the look (a shell's short-lived child exited or
	// started: proc.Inventory.Compare); no failure.
	Churn []string `json:"churn,omitempty"`
	Match bool     `json:"match"`
}

// Inventory is what a restore receipt compares of a container's processes:
// every process (the keeper included, since it is in every image) by its
// pid inside the container and its command name, and the TCP sockets
// listening in the container's network namespace. An image's inventory is
// read from CRIU's own files (ImageInventory), a running container's from
// /proc (Runtime.Inventory), so neither side is turnsnap's record of the
// other.
//
// The wire form of proc.Inventory.
type Inventory struct {
	Procs []InventoryProc `json:"procs"` // sorted by PID
	// Listening are "tcp:PORT" and "tcp6:PORT", sorted, each once.
	Listening []string `json:"listening"`
}

// InventoryProc is one process of an Inventory.
//
// The wire form of proc.InventoryProc.
type InventoryProc struct {
	PID int `json:"pid"` // inside the container's pid namespace
	// PPID is the parent's pid inside the container (0: outside it).
	PPID int    `json:"ppid"`
	Comm string `json:"comm"` // the kernel's command name (at most 15 bytes)
	// Cmdline is the running process's arguments; an image's inventory
	// leaves it empty (CRIU keeps it only in the process's memory pages).
	Cmdline []string `json:"cmdline,omitempty"`
}
