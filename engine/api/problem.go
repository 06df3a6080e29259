package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"syscall"

	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Problem is an RFC 9457 problem detail (application/problem+json). Class
// carries the errdefs class of the error, which the client maps back to
// the same errdefs error, so the CLI exits with the same code through the
// daemon as without it.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Class  string `json:"class"`
	// ExitCode is a shell's code for a command that cannot run in the
	// sandbox (127 not found, 126 not executable), so the CLI exits the
	// same through the daemon as directly.
	ExitCode int `json:"exit_code,omitempty"`
	// Receipt is a restore_incomplete restore's receipt (engine.Receipt):
	// what differs, and what matched.
	Receipt *engine.Receipt `json:"receipt,omitempty"`
	// State is what a restore_incomplete restore left the sandbox as.
	State string `json:"state,omitempty"`
}

// ProblemType prefixes a problem's type URI; the class completes it.
const ProblemType = "https://turnsnap.dev/problems/"

// classes pairs each errdefs class with its wire name and HTTP status, in
// the order exitCode checks them (a key error first: a sealed object that
// does not open also reads as corrupt).
var classes = []struct {
	err    error
	name   string
	status int
}{
	{errdefs.ErrKey, "key", http.StatusForbidden},
	// A restore that ran and made something other than the checkpoint:
	// the server failed to do what was asked, and says what it did.
	{errdefs.ErrRestoreIncomplete, "restore_incomplete", http.StatusInternalServerError},
	{errdefs.ErrInvalid, "invalid", http.StatusBadRequest},
	{errdefs.ErrNotFound, "not_found", http.StatusNotFound},
	{errdefs.ErrExists, "exists", http.StatusConflict},
	{errdefs.ErrPrecondition, "precondition", http.StatusPreconditionFailed},
	{errdefs.ErrUnavailable, "unavailable", http.StatusServiceUnavailable},
	{errdefs.ErrCorrupt, "corrupt", http.StatusUnprocessableEntity},
	{errdefs.ErrNoSpace, "no_space", http.StatusInsufficientStorage},
}

// Class names err's errdefs class ("error" when it has none).
func Class(err error) string {
	for _, c := range classes {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return "no_space"
	}
	return "error"
}

// ProblemFor describes err as a problem.
func ProblemFor(err error) *Problem {
	class := Class(err)
	p := &Problem{Type: ProblemType + class, Title: class, Status: http.StatusInternalServerError,
		Detail: err.Error(), Class: class}
	for _, c := range classes {
		if c.name == class {
			p.Status = c.status
		}
	}
	var ce *engine.CommandError
	if errors.As(err, &ce) {
		p.ExitCode = ce.Code
	}
	var ri *engine.RestoreIncompleteError
	if errors.As(err, &ri) {
		p.Receipt, p.State = ri.Receipt, ri.State
	}
	if errors.Is(err, context.Canceled) && class == "error" {
		p.Status = 499 // the client went away (nginx's code; never seen by it)
	}
	return p
}

// Error makes a problem an error of its class again: errors.Is(err,
// errdefs.ErrNotFound) holds for a not_found problem, and the message is
// the server's own.
func (p *Problem) Error() string { return p.Detail }

// Unwrap is the problem's errdefs class.
func (p *Problem) Unwrap() error {
	for _, c := range classes {
		if c.name == p.Class {
			return c.err
		}
	}
	return nil
}

func writeProblem(w http.ResponseWriter, err error) {
	p := ProblemFor(err)
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(p.Status)
	json.NewEncoder(w).Encode(p)
}

// invalidf is an ErrInvalid error for bad requests.
func invalidf(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalid)...)
}

func notFoundf(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrNotFound)...)
}
