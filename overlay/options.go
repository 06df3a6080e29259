package overlay

import (
	"errors"
	"fmt"
	"strings"

	"github.com/moby/sys/mountinfo"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/mounts"
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

// pathLayers is what mountinfo lists for the layers of a mount(2) mount.
func pathLayers(lower, upper, work string) string {
	return "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
}

// checkMounted fails unless the overlay at path runs with every pinned
// feature and exactly the layers it was given (layers: hiddenLayers or
// pathLayers): overlay can fall back quietly (index=off when the upper
// cannot encode file handles, read-only when the workdir is unusable), and
// the scan would then record a state the mount does not have; and a mount
// meant to hide the host paths must not list one.
//
// It asks statmount(2) about the mount at path (two system calls) and
// reads the mount table only on a kernel without it: the table is every
// mount of the namespace, printed by the kernel and parsed here, about
// 0.4 ms of a rollback on a machine with a hundred mounts.
func checkMounted(path, layers string) error {
	m, err := mounts.SuperOptions(path)
	if errors.Is(err, mounts.ErrNoStatmount) {
		return checkMountedTable(path, layers)
	}
	if err != nil {
		return fmt.Errorf("overlay on %s: %w", path, err)
	}
	// Without a mount of its own, path answers the mount it lies in.
	if m.Point != path {
		return fmt.Errorf("overlay on %s is not mounted: %w", path, errdefs.ErrPrecondition)
	}
	if m.FSType != "overlay" {
		return fmt.Errorf("%s is mounted as %s, not overlay: %w", path, m.FSType, errdefs.ErrPrecondition)
	}
	return checkSuperOptions(m.VFSOptions, layers)
}

// checkMountedTable is checkMounted by the mount table.
func checkMountedTable(path, layers string) error {
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil {
		return fmt.Errorf("mount table: %w", err)
	}
	if len(ms) == 0 {
		return fmt.Errorf("overlay on %s is not mounted: %w", path, errdefs.ErrPrecondition)
	}
	return checkSuperOptions(ms[len(ms)-1].VFSOptions, layers)
}

// layerKeys are the overlay options that name layers.
var layerKeys = map[string]bool{"lowerdir": true, "lowerdir+": true, "upperdir": true, "workdir": true, "datadir+": true}

// checkSuperOptions checks an overlay's super options as mountinfo shows
// them: options at their default ("off") are not listed, and the layers
// come first, in the order given.
func checkSuperOptions(vfs, layers string) error {
	have := map[string]string{}
	var gotLayers []string
	for _, o := range strings.Split(vfs, ",") {
		k, v, _ := strings.Cut(o, "=")
		if layerKeys[k] {
			gotLayers = append(gotLayers, k+"="+unescapeMountinfo(v))
			continue
		}
		have[k] = v
	}
	if got := strings.Join(gotLayers, ","); got != layers {
		return fmt.Errorf("overlay lists layers %q, want %q (options %q): %w", got, layers, vfs, errdefs.ErrPrecondition)
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

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space,
// \011, \012, \134) in an option value.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) && isOctal(s[i+1:i+4]) {
			n := (s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0')
			b.WriteByte(n)
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := range 3 {
		if s[i] < '0' || s[i] > '7' {
			return false
		}
	}
	return true
}
