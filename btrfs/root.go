package btrfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/sys/mountinfo"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/mounts"
	"golang.org/x/sys/unix"
)

// Root is one btrfs sandbox root.
type Root struct {
	b    *Backend
	dir  string
	base string
	// staged holds the snapshots taken by scans of this process that wait
	// for their checkpoint to commit.
	staged map[*fstree.ScanResult]*stagedScan
}

// Path is the sandbox's root as processes see it.
func (r *Root) Path() string { return filepath.Join(r.dir, "root") }

// sbDir returns the sandbox's directory in the pool.
func (r *Root) sbDir() (string, error) {
	target, err := os.Readlink(filepath.Join(r.dir, "pool"))
	if err != nil {
		return "", fmt.Errorf("sandbox %s: no pool link: %w", r.dir, err)
	}
	if filepath.Dir(target) != r.b.sandboxesDir() {
		return "", fmt.Errorf("sandbox %s: pool link %s is outside pool %s: %w", r.dir, target, r.b.pool, errdefs.ErrPrecondition)
	}
	return target, nil
}

// gen returns the live generation directory.
func (r *Root) gen() (sbDir, gen string, err error) {
	if sbDir, err = r.sbDir(); err != nil {
		return "", "", err
	}
	target, err := os.Readlink(filepath.Join(sbDir, "current"))
	if err != nil {
		return "", "", fmt.Errorf("sandbox %s: no live generation: %w", r.dir, err)
	}
	return sbDir, filepath.Join(sbDir, target), nil
}

// baseDir returns the sandbox's base directory in the pool.
func (r *Root) baseDir(sbDir string) (string, baseInfo, error) {
	base := r.base
	if base == "" {
		var si sandboxInfo
		data, err := readFile(filepath.Join(sbDir, "info.json"))
		if err == nil {
			err = jsonUnmarshal(data, &si)
		}
		if err != nil {
			return "", baseInfo{}, fmt.Errorf("sandbox %s: %w", r.dir, err)
		}
		base = filepath.Join(r.b.basesDir(), si.Base.String())
	}
	bi, err := readBaseInfo(base)
	return base, bi, err
}

// Mount bind-mounts the live subvolume on Path unless it is mounted
// already, so a sandbox used after a reboot comes back transparently. The
// mount is noatime: an atime update would be a change to the subvolume,
// and reading a file is not a turn's state. It first clears what a crash
// left in the sandbox's pool directory.
func (r *Root) Mount(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	mounted, err := mountinfo.Mounted(r.Path())
	if err != nil {
		return fmt.Errorf("sandbox %s: mount table: %w", r.dir, err)
	}
	if mounted {
		return nil
	}
	sbDir, g, err := r.gen()
	if err != nil {
		return err
	}
	if err := r.recover(sbDir, g); err != nil {
		return err
	}
	live := filepath.Join(g, "live")
	if err := unix.Mount(live, r.Path(), "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("sandbox %s: bind %s: %w", r.dir, live, err)
	}
	if err := unix.Mount("", r.Path(), "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOATIME, ""); err != nil {
		unix.Unmount(r.Path(), 0)
		return fmt.Errorf("sandbox %s: remount noatime: %w", r.dir, err)
	}
	return nil
}

// Unmount unmounts the root if it is mounted. A busy root is an error: the
// caller must stop what runs in the sandbox first.
func (r *Root) Unmount(ctx context.Context) error {
	return mounts.Unmount(ctx, r.Path(), r.dir)
}

// Remove unmounts the root and deletes its subvolumes, restore points
// included, and the sandbox directory. The base stays: other sandboxes
// share it.
func (r *Root) Remove(ctx context.Context) error {
	if err := r.Unmount(ctx); err != nil {
		return err
	}
	if sbDir, err := r.sbDir(); err == nil {
		if err := removeTree(sbDir); err != nil {
			return fmt.Errorf("sandbox %s: %w", r.dir, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.RemoveAll(r.dir); err != nil {
		return fmt.Errorf("sandbox %s: remove: %w", r.dir, err)
	}
	return nil
}

// recover clears what an interrupted operation left in a sandbox's pool
// directory: generations other than the live one, scan snapshots no
// checkpoint took, restore points half made, and restore points set aside
// for a replacement that did not finish (put back, or dropped if the
// replacement is in place).
func (r *Root) recover(sbDir, live string) error {
	entries, err := os.ReadDir(sbDir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(sbDir, e.Name())
		switch {
		case strings.HasPrefix(e.Name(), "gen-") && p != live, strings.HasPrefix(e.Name(), ".scan-") && !r.isStaged(p):
			if err := removeTree(p); err != nil {
				return err
			}
		}
	}
	return r.recoverPoints(sbDir)
}

func (r *Root) isStaged(p string) bool {
	for _, s := range r.staged {
		if s.dir == p {
			return true
		}
	}
	return false
}

// removeTree deletes a directory tree that may hold subvolumes (which
// plain unlinking cannot remove), without following symlinks.
func removeTree(dir string) error {
	var subvols []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() && isSubvolume(p) {
			subvols = append(subvols, p)
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		return err
	}
	slices.Reverse(subvols)
	for _, sv := range subvols {
		if err := deleteSubvolume(sv); err != nil {
			if !errors.Is(err, unix.EPERM) {
				return err
			}
			// A read-only subvolume whose flag a crash left mid-change:
			// root may always clear it.
			if err := setReadOnly(sv, false); err != nil {
				return err
			}
			if err := deleteSubvolume(sv); err != nil {
				return err
			}
		}
	}
	return os.RemoveAll(dir)
}
