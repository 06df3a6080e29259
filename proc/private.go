package proc

import (
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// Process images hold the memory of the sandbox's processes: API keys in
// environment variables, tokens in heap pages. Everything of theirs that
// touches the disk stays private to root and lives only as long as needed:
//
//   - image and work directories are 0700 and their files 0600. CRIU
//     creates its image files 0644 (CR_FD_PERM, less the umask); they are
//     written inside a 0700 directory, so no other user can open them
//     meanwhile, and Checkpoint makes them 0600 before it returns, so the
//     modes recorded with a checkpoint, and a restore's copy, are 0600.
//   - a work directory (CRIU's logs and statistics) is removed when its
//     dump or restore succeeds. A failed one is kept for its logs, which
//     the error names, under work/failed/, and only the newest failedKeep
//     of them: a host whose dumps keep failing does not fill up.
//   - nothing goes to /tmp: every directory is under the state root.

// failedKeep is how many failed work directories are kept.
const failedKeep = 4

func failedRoot(root string) string { return filepath.Join(workRoot(root), "failed") }

// privatise makes dir and everything under it private to root: dirs 0700,
// files without group or other permissions. It follows no symlink and
// leaves other kinds of entries alone; errors are ignored (the tree is
// inside a 0700 directory either way, and this is defence in depth).
func privatise(dir string) {
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		switch {
		case d.IsDir():
			os.Chmod(p, 0o700)
		case d.Type().IsRegular():
			if fi, err := d.Info(); err == nil && fi.Mode().Perm()&0o077 != 0 {
				os.Chmod(p, fi.Mode().Perm()&^0o077)
			}
		}
		return nil
	})
}

// keepFailed moves the work directory of a failed dump or restore under
// work/failed (private, named by the time so the newest sort last), drops
// all but the newest failedKeep there, and returns where the directory is
// now, for the error message.
func (r *Runtime) keepFailed(work string) string {
	failed := failedRoot(r.cfg.StateRoot)
	if err := os.MkdirAll(failed, 0o700); err != nil {
		r.log.Warn("failed work dir left in place", "dir", work, "err", err)
		return work
	}
	privatise(work)
	dst := filepath.Join(failed, time.Now().UTC().Format("20060102T150405.000000000")+"-"+filepath.Base(work))
	if err := os.Rename(work, dst); err != nil {
		r.log.Warn("failed work dir left in place", "dir", work, "err", err)
		return work
	}
	ents, err := os.ReadDir(failed)
	if err != nil {
		return dst
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	for _, n := range names[:max(0, len(names)-failedKeep)] {
		os.RemoveAll(filepath.Join(failed, n))
	}
	return dst
}
