// Package mounts holds the mount handling every sandbox-root backend
// shares: a root is a mount point, and taking it down must say clearly why
// it could not be.
package mounts

import (
	"context"
	"errors"
	"fmt"

	"github.com/moby/sys/mountinfo"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

// Unmount unmounts path if it is mounted. A busy mount is an error wrapping
// errdefs.ErrPrecondition: the caller must stop what runs there first. who
// names the sandbox in errors.
func Unmount(ctx context.Context, path, who string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	mounted, err := mountinfo.Mounted(path)
	if errors.Is(err, unix.ENOENT) {
		return nil // a root already deleted (a removal killed midway) is not mounted
	}
	if err != nil {
		return fmt.Errorf("sandbox %s: mount table: %w", who, err)
	}
	if !mounted {
		return nil
	}
	if err := unix.Unmount(path, 0); err != nil {
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("sandbox %s: root %s is busy (a process has a file or its cwd there): %w",
				who, path, errdefs.ErrPrecondition)
		}
		return fmt.Errorf("sandbox %s: unmount: %w", who, err)
	}
	return nil
}
