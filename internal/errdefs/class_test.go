package errdefs

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
)

func TestClassRoundTrips(t *testing.T) {
	for _, c := range classes {
		err := fmt.Errorf("sandbox s: %w", c.err)
		if got := Class(err); got != c.name {
			t.Errorf("Class(%v) = %q, want %q", err, got, c.name)
		}
		if got := ByClass(c.name); !errors.Is(err, got) {
			t.Errorf("ByClass(%q) = %v, want %v", c.name, got, c.err)
		}
	}
	if got := Class(fmt.Errorf("write: %w", syscall.ENOSPC)); got != "no_space" {
		t.Errorf("ENOSPC: %q", got)
	}
	// A sealed object that does not open is a key error, not corrupt.
	if got := Class(fmt.Errorf("%w: %w", ErrCorrupt, ErrKey)); got != "key" {
		t.Errorf("key and corrupt: %q", got)
	}
	if Class(errors.New("x")) != "error" || ByClass("error") != nil {
		t.Error("no class")
	}
}
