package errdefs

import (
	"errors"
	"syscall"
)

// classes pairs each class with its name on the wire (the API's problem
// class, the CLI's --json error class), in the order Class checks them: a
// key error first, since a sealed object that does not open also reads as
// corrupt.
var classes = []struct {
	err  error
	name string
}{
	{ErrKey, "key"},
	{ErrRestoreIncomplete, "restore_incomplete"},
	{ErrInvalid, "invalid"},
	{ErrNotFound, "not_found"},
	{ErrExists, "exists"},
	{ErrPrecondition, "precondition"},
	{ErrUnavailable, "unavailable"},
	{ErrCorrupt, "corrupt"},
	{ErrNoSpace, "no_space"},
}

// Class names err's class ("error" when it has none). A full disk the
// kernel reported (ENOSPC, EDQUOT) is no_space even unwrapped.
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

// ByClass is the error of a class name, the inverse of Class; nil for
// "error" and names it does not know.
func ByClass(name string) error {
	for _, c := range classes {
		if c.name == name {
			return c.err
		}
	}
	return nil
}
