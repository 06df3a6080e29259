package intent

import (
	"context"
	"log/slog"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/procs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
)

// Deps is what the intents need of the engine.
type Deps struct {
	// Dir is the home's intents directory (HOME/intents).
	Dir string
	Log *slog.Logger
	// Loader reads what a restore writes (the engine's content repo).
	Loader delta.BlobLoader
	// Checkpoint reads checkpoint id from the catalog.
	Checkpoint func(ctx context.Context, id delta.ID) (*delta.Checkpoint, error)
	// MoveHead points a sandbox's head at id: its ref object, then the
	// catalog.
	MoveHead func(ctx context.Context, name string, sb *delta.Sandbox, id delta.ID) error
	// Untrack drops the change tracker of a sandbox whose root is remounted.
	Untrack func(name string)
	// ReadyImage reads and verifies cp's process image into a work
	// directory; clean removes it.
	ReadyImage func(ctx context.Context, cp *delta.Checkpoint, fsOnly bool) (img string, clean func(), err error)
	// AcceptRestored runs once cp's processes were restored onto root
	// (receipt.Checker.AcceptRestored).
	AcceptRestored func(ctx context.Context, name string, root rootfs.Root, cp *delta.Checkpoint)
	Phase          func(string)
	Procs          Processes
}

// Processes is what the intents need of the sandboxes' containers
// (procs.Manager).
type Processes interface {
	Stop(ctx context.Context, c procs.Container) error
	CheckHost(ctx context.Context, cp *delta.Checkpoint) error
	Restore(ctx context.Context, c procs.Container, root, img string, cp *delta.Checkpoint) error
}

// Intents is the home's intents directory and the rules for what it holds.
type Intents struct{ d Deps }

// New returns the intents of the directory d.Dir.
func New(d Deps) *Intents { return &Intents{d: d} }

// Sandbox is what the intents need about a sandbox being loaded.
type Sandbox struct {
	Sandbox *delta.Sandbox
	Root    rootfs.Root
	Head    *delta.Checkpoint
	// Dir is the sandbox's directory in the home.
	Dir string
	// Container is the sandbox's container (procs.Manager.Container).
	Container procs.Container
}
