package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// statuses is each errdefs class's HTTP status (errdefs.Class names
// them); a class not here is a 500.
var statuses = map[string]int{
	"key": http.StatusForbidden,
	// A restore that ran and made something other than the checkpoint:
	// the server failed to do what was asked, and says what it did.
	"restore_incomplete": http.StatusInternalServerError,
	"invalid":            http.StatusBadRequest,
	"not_found":          http.StatusNotFound,
	"exists":             http.StatusConflict,
	"precondition":       http.StatusPreconditionFailed,
	"unavailable":        http.StatusServiceUnavailable,
	"corrupt":            http.StatusUnprocessableEntity,
	"no_space":           http.StatusInsufficientStorage,
}

// ProblemFor describes err as a problem.
func ProblemFor(err error) *api.Problem {
	class := errdefs.Class(err)
	p := &api.Problem{Type: api.ProblemType + class, Title: class, Status: http.StatusInternalServerError,
		Detail: err.Error(), Class: class, Err: errdefs.ByClass(class)}
	if st, ok := statuses[class]; ok {
		p.Status = st
	}
	var ce *engine.CommandError
	if errors.As(err, &ce) {
		p.ExitCode = ce.Code
	}
	var ri *engine.RestoreIncompleteError
	if errors.As(err, &ri) {
		p.Receipt, p.State = receiptOf(ri.Receipt), ri.State
	}
	if errors.Is(err, context.Canceled) && class == "error" {
		p.Status = 499 // the client went away (nginx's code; never seen by it)
	}
	return p
}

// WriteProblem answers a request with err as a problem+json.
func WriteProblem(w http.ResponseWriter, err error) { writeProblem(w, err) }

func writeProblem(w http.ResponseWriter, err error) {
	p := ProblemFor(err)
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(p.Status)
	json.NewEncoder(w).Encode(p)
}

// Invalidf is an ErrInvalid error for bad requests.
func Invalidf(format string, args ...any) error { return invalidf(format, args...) }

func invalidf(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalid)...)
}

func notFoundf(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrNotFound)...)
}
