package btrfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/delta"
)

// A restore point is a committed checkpoint's state kept on the pool:
//
//	snaps/TREE/root       read-only snapshot of the live subvolume
//	snaps/TREE/meta       read-only snapshot of its scan records
//	snaps/TREE/info.json  pointInfo
//
// TREE is the checkpoint's layer tree. Rollback and branch snapshot these
// two subvolumes instead of writing any file.
type pointInfo struct {
	Tree delta.ID `json:"tree"`
	Base delta.ID `json:"base"`
	// RootCtransid is the root snapshot's last content change when it was
	// made: a read-only snapshot never changes, so a different one means
	// someone flipped it writable and wrote to it, and it is not trusted.
	// (Its generation is no use: snapshotting a subvolume moves it.)
	RootCtransid uint64    `json:"root_ctransid"`
	Created      time.Time `json:"created"`
}

func (r *Root) snapsDir(sbDir string) string { return filepath.Join(sbDir, "snaps") }

// keepPoint makes the scan directory tmp (holding the read-only scan
// snapshot tmp/root) the restore point of tree: it adds a snapshot of meta
// and the info, then renames the whole directory into place; an existing
// point of the same tree is set aside first and put back if that fails.
func (r *Root) keepPoint(sbDir, tmp, meta string, tree, base delta.ID) error {
	dir := r.snapsDir(sbDir)
	ok := false
	defer func() {
		if !ok {
			removeTree(tmp)
		}
	}()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := snapshot(meta, filepath.Join(tmp, "meta"), true); err != nil {
		return err
	}
	si, err := getSubvolInfo(filepath.Join(tmp, "root"))
	if err != nil {
		return err
	}
	info := pointInfo{Tree: tree, Base: base, RootCtransid: si.Ctransid, Created: time.Now().UTC()}
	if err := writeJSON(filepath.Join(tmp, "info.json"), info); err != nil {
		return err
	}
	if err := replaceDir(tmp, filepath.Join(dir, tree.String())); err != nil {
		return err
	}
	ok = true
	return nil
}

// replaceDir renames src to dst. An existing dst is renamed aside first,
// deleted once src is in place, and put back if that rename fails.
func replaceDir(src, dst string) error {
	if _, err := os.Lstat(dst); err != nil {
		return os.Rename(src, dst)
	}
	aside := filepath.Join(filepath.Dir(dst), randomName(".rm-"))
	if err := os.Rename(dst, aside); err != nil {
		return err
	}
	if err := os.Rename(src, dst); err != nil {
		if perr := os.Rename(aside, dst); perr != nil {
			return errors.Join(err, fmt.Errorf("put back %s: %w", dst, perr))
		}
		return err
	}
	return removeTree(aside)
}

// recoverPoints finishes what a crash interrupted among the restore
// points: one set aside (for a replacement, or to be pruned) is put back
// unless a point of its tree is in place, in which case it is deleted.
// Half-made points are scan directories, which recover deletes.
func (r *Root) recoverPoints(sbDir string) error {
	dir := r.snapsDir(sbDir)
	names, err := readNames(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, n := range names {
		p := filepath.Join(dir, n)
		switch {
		case strings.HasPrefix(n, ".rm-"):
			info, err := readPointInfo(p)
			final := filepath.Join(dir, info.Tree.String())
			if _, serr := os.Lstat(final); err != nil || serr == nil {
				if err := removeTree(p); err != nil {
					return err
				}
			} else if err := os.Rename(p, final); err != nil {
				return err
			}
		}
	}
	return nil
}

func readPointInfo(dir string) (pointInfo, error) {
	var pi pointInfo
	data, err := readFile(filepath.Join(dir, "info.json"))
	if err != nil {
		return pi, err
	}
	if err := jsonUnmarshal(data, &pi); err != nil {
		return pi, fmt.Errorf("%s: %w", dir, err)
	}
	return pi, nil
}

// validPoint reports whether dir is an intact restore point of tree on base.
func validPoint(dir string, tree, base delta.ID) bool {
	pi, err := readPointInfo(dir)
	if err != nil || pi.Tree != tree || pi.Base != base {
		return false
	}
	si, err := getSubvolInfo(filepath.Join(dir, "root"))
	if err != nil || !si.ReadOnly || si.Ctransid != pi.RootCtransid {
		return false
	}
	return isSubvolume(filepath.Join(dir, "meta"))
}

// findPoint returns a restore point of tree on base: this sandbox's own, or
// one of another sandbox in the same pool (a branch).
func (r *Root) findPoint(sbDir string, tree, base delta.ID) (string, bool) {
	own := filepath.Join(r.snapsDir(sbDir), tree.String())
	if validPoint(own, tree, base) {
		return own, true
	}
	others, _ := filepath.Glob(filepath.Join(r.b.sandboxesDir(), "*", "snaps", tree.String()))
	for _, p := range others {
		if p != own && validPoint(p, tree, base) {
			return p, true
		}
	}
	return "", false
}

// prune deletes all but the keep newest restore points.
func (r *Root) prune(sbDir string, keep int) error {
	dir := r.snapsDir(sbDir)
	names, err := readNames(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	type point struct {
		path    string
		created time.Time
	}
	count := 0
	for _, n := range names {
		if !strings.HasPrefix(n, ".") {
			count++
		}
	}
	if count <= keep {
		return nil
	}
	var points []point
	for _, n := range names {
		if strings.HasPrefix(n, ".") {
			continue
		}
		p := filepath.Join(dir, n)
		pi, _ := readPointInfo(p)
		points = append(points, point{p, pi.Created})
	}
	slices.SortFunc(points, func(a, b point) int { return b.created.Compare(a.created) })
	for _, pt := range points[keep:] {
		// Set aside first: a crash mid-delete leaves a ".rm-" name, which
		// recovery deletes or puts back whole, never a half point in place.
		aside := filepath.Join(dir, randomName(".rm-"))
		if err := os.Rename(pt.path, aside); err != nil {
			return err
		}
		if err := removeTree(aside); err != nil {
			return err
		}
	}
	return nil
}

// PruneRestorePoints deletes all but the keep newest local restore points
// of the sandbox. Checkpoints whose point is gone restore from the store.
func (r *Root) PruneRestorePoints(ctx context.Context, keep int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sbDir, err := r.sbDir()
	if err != nil {
		return err
	}
	return r.prune(sbDir, keep)
}

// RestorePoints returns the layer trees this sandbox has local restore
// points of.
func (r *Root) RestorePoints() ([]delta.ID, error) {
	sbDir, err := r.sbDir()
	if err != nil {
		return nil, err
	}
	names, err := readNames(r.snapsDir(sbDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	var out []delta.ID
	for _, n := range names {
		if id, err := delta.ParseID(n); err == nil {
			out = append(out, id)
		}
	}
	slices.SortFunc(out, func(a, b delta.ID) int { return strings.Compare(a.String(), b.String()) })
	return out, err
}
