package delta

import (
	"fmt"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// SandboxName is a sandbox's label on its home, a ValidRefName. The
// catalog keys sandboxes and their heads by it; the store never does (it
// keys them by SandboxKey), so the two are distinct types and the compiler
// keeps them apart.
type SandboxName string

// ParseSandboxName checks that s may name a sandbox (ValidRefName); the
// error wraps errdefs.ErrInvalid and names s once.
func ParseSandboxName(s string) (SandboxName, error) {
	if !ValidRefName(s) {
		return "", fmt.Errorf("sandbox name %q is not valid: 1 to %d characters of A-Z a-z 0-9 . _ -, not starting with '.' or '-': %w",
			s, MaxNameLen, errdefs.ErrInvalid)
	}
	return SandboxName(s), nil
}

// SandboxKey is what identifies a sandbox across homes and names it in the
// store (its description, its head): its ID (32 lowercase hex digits), or
// a legacy sandbox's name.
type SandboxKey string
