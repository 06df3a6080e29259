package overlay

import (
	"fmt"
	"strings"

	"github.com/moby/sys/mountinfo"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// FeatureOptions pins every overlayfs feature the scan's semantics depend
// on, so a kernel's build-time defaults (CONFIG_OVERLAY_FS_REDIRECT_DIR,
// _INDEX, _NFS_EXPORT, _XINO_AUTO, _METACOPY) never decide them:
//
//   - redirect_dir=on: rename(2) of a directory that comes from the base
//     works (git mv, os.Rename, package managers) instead of failing with
//     EXDEV; the scan records such a directory, which overlay marks with
//     trusted.overlay.redirect, as opaque with its merged contents.
//   - index=on: a copied-up base hardlink stays one inode under every name
//     (the index in the workdir ties the upper inode to its lower origin),
//     and it is a prerequisite of nfs_export. The scan links up the other
//     names before it reads the upper, so the layer records the link. Its
//     cost: overlay refuses (EBUSY) to mount an upper that a copy of the
//     previous mount still uses, which a process that made a mount
//     namespace while the root was mounted keeps until it exits; Mount
//     retries briefly and then names the holder (docker's overlay2 mounts
//     index=off for this reason; we need the index for nfs_export).
//   - nfs_export=on: file handles of the mount decode, which fanotify's
//     FID-reporting marks need to watch the sandbox for changes.
//   - metacopy=off: a metadata change copies the data up too; with
//     metacopy an upper file can be a data-less stub, which the scan would
//     record as zeros (it refuses such files instead).
//   - xino=off: inode numbers are the real filesystems' (upper and lower
//     share one filesystem here), never remapped with layer bits, so a
//     scan's cache keys stay valid across remounts.
//   - uuid=on: the origin and index records carry the lower filesystem's
//     UUID, so an upper is never silently used with another lower copy.
const FeatureOptions = "redirect_dir=on,index=on,nfs_export=on,metacopy=off,xino=off,uuid=on"

// MountOptions returns the overlay mount data for the given directories.
// Kept pure so option strings are testable without root.
func MountOptions(lower, upper, work string) (string, error) {
	for _, p := range []string{lower, upper, work} {
		if err := checkOptionPath(p); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,%s", lower, upper, work, FeatureOptions), nil
}

// checkMounted fails unless the overlay at path runs with every pinned
// feature: overlay can fall back quietly (index=off when the upper cannot
// encode file handles, read-only when the workdir is unusable), and the
// scan would then record a state the mount does not have.
func checkMounted(path string) error {
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil {
		return fmt.Errorf("mount table: %w", err)
	}
	if len(ms) == 0 {
		return fmt.Errorf("overlay on %s is not mounted: %w", path, errdefs.ErrPrecondition)
	}
	return checkSuperOptions(ms[len(ms)-1].VFSOptions)
}

// checkSuperOptions checks an overlay's super options as mountinfo shows
// them: options at their default ("off") are not listed.
func checkSuperOptions(vfs string) error {
	have := map[string]string{}
	for _, o := range strings.Split(vfs, ",") {
		k, v, _ := strings.Cut(o, "=")
		have[k] = v
	}
	if _, ro := have["ro"]; ro {
		return fmt.Errorf("overlay mounted read-only (its workdir is unusable): %w", errdefs.ErrPrecondition)
	}
	for _, o := range strings.Split(FeatureOptions, ",") {
		k, want, _ := strings.Cut(o, "=")
		got, listed := have[k]
		if !listed {
			got = "off"
		}
		if got != want {
			return fmt.Errorf("overlay refused %s=%s (mounted with %s=%s; options %q): %w", k, want, k, got, vfs, errdefs.ErrPrecondition)
		}
	}
	return nil
}
