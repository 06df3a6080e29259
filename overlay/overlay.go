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
//	D/gen-N/work/       overlay workdir; work/index/ ties upper inodes to their
//	                    lower origins (index=on) and is kept across mounts
//	D/gen-N/scan.cache  what upper/ looked like at the last committed checkpoint
//	D/lower.links       the lower's hardlink groups (computed once, see linkUp)
//
// Mounts pin every overlayfs feature option (options.go) and pass the
// layers as file descriptors, so the mount table names no host path
// (fsmount.go; mount(2) with paths on kernels before 6.15).
//
// A restore rewrites only what differs between the live upper and the
// target (restore.go), so files in both states keep their inodes; a crash
// midway leaves a mix that the engine's rollback intent has the next
// command finish. Where the diff cannot be applied in place, a restore
// builds a whole new generation beside the live one and switches "current"
// with one rename, so a crash leaves either the old state or the new one;
// stale generations are removed on the next mount.
//
// The Backend also runs the overlay-only policy the engine reaches through
// internal/rootfs's optional interfaces: frozen layers and their policy
// (rootfs.Freezer: freezer.go over package overlay/frozen), change
// tracking per sandbox (rootfs.TurnScanner: turnscan.go over package
// overlay/track's fanotify trackers) and tracked rollbacks
// (rootfs.Rollbacker: rollback.go).
package overlay

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

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
	// onBusy, for tests, runs each time a mount is refused with EBUSY.
	onBusy func()
	// mountFD, for tests, replaces the descriptor mount (fsmount.go), to
	// take the mount(2) fallback of older kernels.
	mountFD func(lowers []string, gen, target string) error
	// loader reads the frozen layer's trees a stacked generation's scan
	// is composed onto (stack.go); nil for roots made without a backend.
	loader func() delta.BlobLoader
	keys   *keyCache // the backend's, shared by its roots (compose.go)
	ids    delta.IDs // the home's content ID scheme (plain without a backend)
	// memo, if set, is the backend's memo of decoded scan caches.
	memo *cacheMemo
	// links, if set, is the backend's memo of lowers' hardlink groups.
	links *linkMemo
	// lastFallback says why the last Restore rebuilt the layer whole
	// ("" if it applied a diff), for tests and diagnostics.
	lastFallback string
	// rebuildAll, if set and true, makes Restore rebuild the layer whole
	// (Backend.SetRebuildRestores).
	rebuildAll *atomic.Bool
}

// Open returns the overlay root kept in dir on top of the read-only lower
// directory. It touches nothing; Mount brings the root up.
func Open(dir, lower string) *Root { return &Root{dir: dir, lower: lower} }

// Create lays out a new sandbox in dir (which must not exist) whose upper
// layer is tree (delta.EmptyTree() for a fresh sandbox), and mounts it.
func Create(ctx context.Context, dir, lower string, tree delta.ID, loader delta.BlobLoader) (*Root, error) {
	return create(ctx, Open(dir, lower), tree, loader)
}

// create is Create of the root r describes.
func create(ctx context.Context, r *Root, tree delta.ID, loader delta.BlobLoader) (*Root, error) {
	dir, lower := r.dir, r.lower
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
	// The workdir's index ties the upper's inodes to their lower origins
	// (index=on): keep it. Its scratch area work/ is the kernel's to clean.
	work := filepath.Join(g, "work")
	if err := os.MkdirAll(work, 0o700); err != nil {
		return fmt.Errorf("sandbox %s: workdir: %w", r.dir, err)
	}
	if err := dropWhiteoutIndex(filepath.Join(work, "index")); err != nil {
		return fmt.Errorf("sandbox %s: overlay index: %w", r.dir, err)
	}
	// A stacked generation mounts its frozen layer above the base; lowers
	// checks that each exists.
	lowers, err := r.lowers(g)
	if err != nil {
		return err
	}
	opts, err := StackOptions(lowers, filepath.Join(g, "upper"), work)
	if err != nil {
		return err
	}
	layers, err := r.mount(ctx, g, lowers, opts)
	if err != nil {
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("sandbox %s: mount overlay: its upper layer is still mounted in another mount namespace (%s): a process that made its namespace while the root was mounted keeps a copy, and index=on refuses to share an upper; stop it and retry: %w",
				r.dir, inUseBy(filepath.Join(g, "upper")), errdefs.ErrPrecondition)
		}
		if errors.Is(err, unix.ESTALE) {
			// uuid=on,index=on: the upper remembers the lower it was made
			// on, and this lower is another copy of the base (re-imported,
			// or moved with its inodes renumbered).
			return fmt.Errorf("sandbox %s: mount overlay: the writable layer was made on another copy of base %s (overlay's origin check); restore the sandbox's head to rebuild the layer: %w",
				r.dir, r.lower, errdefs.ErrPrecondition)
		}
		return fmt.Errorf("sandbox %s: mount overlay (%s): %w", r.dir, opts, err)
	}
	if err := checkMounted(r.Path(), layers); err != nil {
		unix.Unmount(r.Path(), 0)
		return fmt.Errorf("sandbox %s: %w", r.dir, err)
	}
	return nil
}

// mountBusyWait is how long a mount refused with EBUSY is retried: a
// container runtime that copied the mount table while the root was mounted
// (runc before its pivot_root) lets go of its copy within milliseconds; a
// long-lived namespace does not, and waiting longer would not help.
const mountBusyWait = 3 * time.Second

// mount mounts the overlay of generation gen, retrying while its upper is
// held by a transient copy of the previous mount in another namespace. It
// returns the layer options mountinfo must list (see checkMounted).
func (r *Root) mount(ctx context.Context, gen string, lowers []string, opts string) (string, error) {
	deadline := time.Now().Add(mountBusyWait)
	for {
		layers, err := r.mountOnce(gen, lowers, opts)
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return layers, err
		}
		if r.onBusy != nil {
			r.onBusy()
		}
		select {
		case <-ctx.Done():
			return "", err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// mountOnce mounts with the layers as descriptors, so that mountinfo shows
// no host path (fsmount.go), or with mount(2) where the kernel cannot.
func (r *Root) mountOnce(gen string, lowers []string, opts string) (string, error) {
	fd := mountFD
	if r.mountFD != nil {
		fd = r.mountFD
	}
	fdErr := fd(lowers, gen, r.Path())
	if fdErr == nil {
		return hiddenLayersOf(len(lowers)), nil
	}
	if !fdMountUnsupported(fdErr) {
		return "", fdErr
	}
	upper := filepath.Join(gen, "upper")
	if err := unix.Mount(mountSource(upper), r.Path(), "overlay", 0, opts); err != nil {
		return "", fmt.Errorf("%w (and with layer descriptors: %v)", err, fdErr)
	}
	return pathLayers(strings.Join(lowers, ":"), upper, filepath.Join(gen, "work")), nil
}

// inUseBy names processes whose mount namespace still holds an overlay on
// upper, for the error that says why a mount was refused.
func inUseBy(upper string) string {
	pids, _ := filepath.Glob("/proc/[0-9]*/mountinfo")
	seen := map[string]bool{}
	var out []string
	for _, p := range pids {
		dir := filepath.Dir(p)
		ns, err := os.Readlink(filepath.Join(dir, "ns", "mnt"))
		if err != nil || seen[ns] {
			continue
		}
		data, err := os.ReadFile(p)
		// Mounts of this version carry the source name; older ones (and
		// the mount(2) fallback) list the upper's path.
		if err != nil || !(strings.Contains(string(data), " overlay "+mountSource(upper)+" ") ||
			strings.Contains(string(data), "upperdir="+upper+",")) {
			continue
		}
		seen[ns] = true
		comm, _ := os.ReadFile(filepath.Join(dir, "comm"))
		out = append(out, fmt.Sprintf("pid %s (%s)", filepath.Base(dir), strings.TrimSpace(string(comm))))
		if len(out) == 3 {
			break
		}
	}
	if len(out) == 0 {
		return "no process found holding it"
	}
	return "held by " + strings.Join(out, ", ")
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
