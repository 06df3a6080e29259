// Package errdefs holds the few error classes every turnsnap package wraps.
//
// Packages wrap one of these with the name of the sandbox, checkpoint or object
// involved (fmt.Errorf("checkpoint %s: %w", id, errdefs.ErrNotFound)); callers
// decide with errors.Is, and the CLI maps each class to its own exit code.
package errdefs

import "errors"

var (
	// ErrNotFound: the named sandbox, checkpoint, ref or object does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists: creating something whose name is taken.
	ErrExists = errors.New("already exists")
	// ErrInvalid: the caller's input is malformed (a bad name, an unknown flag value).
	ErrInvalid = errors.New("invalid argument")
	// ErrPrecondition: the request is well formed but the current state forbids it
	// (a sandbox busy, a checkpoint from an incompatible backend).
	ErrPrecondition = errors.New("failed precondition")
	// ErrUnavailable: a resource is held by someone else or cannot be reached now;
	// retrying later may succeed.
	ErrUnavailable = errors.New("unavailable")
	// ErrCorrupt: stored data does not match its hash or cannot be decoded.
	// Never retried, never ignored.
	ErrCorrupt = errors.New("corrupt data")
	// ErrNoSpace: a filesystem turnsnap writes to (the home, a sandbox's
	// root) is full or out of inodes. Nothing half-written is kept; the
	// same command succeeds once space is freed.
	ErrNoSpace = errors.New("no space left")
	// ErrKey: the store is encrypted and no key, or not its key, was given
	// (or an object does not open with the store's key).
	ErrKey = errors.New("missing or wrong key")
	// ErrRestoreIncomplete: a rollback or branch ran, but what it made is
	// not what the checkpoint holds (a file tree that differs, a process
	// or listening socket of the image that is not back). The restore is
	// not a success: the error says what differs and the state the
	// sandbox was left in (engine.RestoreIncompleteError carries the
	// receipt).
	ErrRestoreIncomplete = errors.New("restore incomplete")
)
