package upload

import (
	"fmt"
	"strings"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// CheckName returns an error wrapping errdefs.ErrInvalid unless name is a
// valid object name under the Store contract. Every Store checks names with
// it before doing anything, so a bad name fails the same way on every backend
// instead of escaping a local directory or becoming an odd S3 key.
func CheckName(name string) error {
	if name == "" {
		return fmt.Errorf("object name is empty: %w", errdefs.ErrInvalid)
	}
	for c := range strings.SplitSeq(name, "/") {
		if why := checkComponent(c); why != "" {
			return fmt.Errorf("object %q: %s: %w", name, why, errdefs.ErrInvalid)
		}
	}
	return nil
}

// checkPrefix validates a List prefix: the part up to its last slash must be
// whole valid components, the part after it a (possibly empty) start of one.
func checkPrefix(prefix string) error {
	dir, partial := splitPrefix(prefix)
	if dir != "" {
		if err := CheckName(strings.TrimSuffix(dir, "/")); err != nil {
			return fmt.Errorf("list prefix %q: %w", prefix, err)
		}
	}
	for i := 0; i < len(partial); i++ {
		if !nameByte(partial[i]) {
			return fmt.Errorf("list prefix %q: byte %q is not allowed: %w", prefix, partial[i], errdefs.ErrInvalid)
		}
	}
	return nil
}

// splitPrefix splits a List prefix after its last slash: "packs/ab" gives
// "packs/" and "ab", so a store need only look inside "packs/".
func splitPrefix(prefix string) (dir, partial string) {
	i := strings.LastIndexByte(prefix, '/') + 1
	return prefix[:i], prefix[i:]
}

// checkComponent returns why c is not a valid name component, or "".
func checkComponent(c string) string {
	switch c {
	case "":
		return "empty path component"
	case ".", "..":
		return fmt.Sprintf("%q path component", c)
	}
	for i := 0; i < len(c); i++ {
		if !nameByte(c[i]) {
			return fmt.Sprintf("byte %q is not allowed", c[i])
		}
	}
	return ""
}

// nameByte reports whether b may appear in a name component: [A-Za-z0-9._-],
// a set that means the same thing on every filesystem and object store.
func nameByte(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' ||
		b == '.' || b == '_' || b == '-'
}
