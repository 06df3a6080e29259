// Package overlay owns overlay sandbox roots: the on-disk layout of one
// sandbox's writable layer, mounting and unmounting it, scanning the upper
// directory (whiteouts, opaque directories, copy-up residue) and replacing it
// with a checkpoint's tree.
//
// Layout of a sandbox directory D (the engine picks D and the lower dir):
//
//	D/root/             the overlay mount point: the sandbox's root
//	D/current           symlink to the live generation, e.g. "gen-123456"
//	D/gen-N/upper/      overlay upperdir
//	D/gen-N/work/       overlay workdir
//	D/gen-N/scan.cache  what upper/ looked like at the last committed checkpoint
//
// A restore builds a whole new generation beside the live one and switches
// "current" with one rename, so a crash leaves either the old state or the
// new one, never a mix; stale generations are removed on the next mount.
package overlay

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/moby/sys/mountinfo"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/mounts"
	"golang.org/x/sys/unix"
)

// Name is the backend's name in records and on the command line.
const Name = "overlay"

// Root is one overlay sandbox root.
type Root struct {
	dir   string
	lower string
}

// Open returns the overlay root kept in dir on top of the read-only lower
// directory. It touches nothing; Mount brings the root up.
func Open(dir, lower string) *Root { return &Root{dir: dir, lower: lower} }

// Create lays out a new sandbox in dir (which must not exist) whose upper
// layer is tree (delta.EmptyTree() for a fresh sandbox), and mounts it.
func Create(ctx context.Context, dir, lower string, tree delta.ID, loader delta.BlobLoader) (*Root, error) {
	if err := checkOptionPath(lower); err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("sandbox dir %s: %w", dir, errdefs.ErrExists)
		}
		return nil, fmt.Errorf("sandbox dir: %w", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "root"), 0o755); err != nil {
		return nil, fmt.Errorf("sandbox dir: %w", err)
	}
	r := Open(dir, lower)
	if err := r.install(ctx, tree, loader); err != nil {
		os.RemoveAll(dir) // nothing is mounted yet: a failed create leaves nothing
		return nil, err
	}
	if err := r.Mount(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return r, nil
}

// Path is the sandbox's root as processes see it.
func (r *Root) Path() string { return filepath.Join(r.dir, "root") }

func (r *Root) gen() (string, error) {
	target, err := os.Readlink(filepath.Join(r.dir, "current"))
	if err != nil {
		return "", fmt.Errorf("sandbox %s: no live layer: %w", r.dir, err)
	}
	return filepath.Join(r.dir, target), nil
}

// MountOptions returns the overlay mount data for the given directories.
// Kept pure so option strings are testable without root.
func MountOptions(lower, upper, work string) (string, error) {
	for _, p := range []string{lower, upper, work} {
		if err := checkOptionPath(p); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work), nil
}

// checkOptionPath refuses paths that overlay's option parser would split.
func checkOptionPath(p string) error {
	if !filepath.IsAbs(p) || strings.ContainsAny(p, ",:\\\n") {
		return fmt.Errorf("overlay path %q must be absolute and free of ',', ':' and '\\': %w", p, errdefs.ErrInvalid)
	}
	return nil
}

// Mount mounts the root unless it is mounted already, so a sandbox used after
// a reboot comes back transparently. It also clears generations left by a
// restore that crashed.
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
	g, err := r.gen()
	if err != nil {
		return err
	}
	r.removeStale(g)
	// overlay refuses a workdir that holds a previous mount's leftovers.
	work := filepath.Join(g, "work")
	if err := os.RemoveAll(work); err != nil {
		return fmt.Errorf("sandbox %s: reset workdir: %w", r.dir, err)
	}
	if err := os.Mkdir(work, 0o700); err != nil {
		return fmt.Errorf("sandbox %s: workdir: %w", r.dir, err)
	}
	opts, err := MountOptions(r.lower, filepath.Join(g, "upper"), work)
	if err != nil {
		return err
	}
	if _, err := os.Stat(r.lower); err != nil {
		return fmt.Errorf("sandbox %s: lower dir: %w", r.dir, err)
	}
	if err := unix.Mount("overlay", r.Path(), "overlay", 0, opts); err != nil {
		return fmt.Errorf("sandbox %s: mount overlay (%s): %w", r.dir, opts, err)
	}
	return nil
}

// Unmount unmounts the root if it is mounted. A busy root is an error: the
// caller must stop what runs in the sandbox first.
func (r *Root) Unmount(ctx context.Context) error {
	return mounts.Unmount(ctx, r.Path(), r.dir)
}

// Remove unmounts the root and deletes the sandbox directory.
func (r *Root) Remove(ctx context.Context) error {
	if err := r.Unmount(ctx); err != nil {
		return err
	}
	if err := os.RemoveAll(r.dir); err != nil {
		return fmt.Errorf("sandbox %s: remove: %w", r.dir, err)
	}
	return nil
}

// removeStale deletes generations other than live (a crashed restore's).
func (r *Root) removeStale(live string) {
	matches, _ := filepath.Glob(filepath.Join(r.dir, "gen-*"))
	for _, m := range matches {
		if m != live {
			os.RemoveAll(m)
		}
	}
}

// syncDir makes a directory's entries (a rename, a new symlink) durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// writeCacheFile replaces a scan cache through a temp file and a rename. It
// does not fsync: the cache is an accelerator, any committed version of it is
// valid, and a torn one fails to decode and costs one full read.
func writeCacheFile(p string, write func(w *bufio.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(p), ".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	w := bufio.NewWriter(f)
	if err := write(w); err != nil {
		f.Close()
		return err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), p)
}
