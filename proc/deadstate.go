package proc

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// A runc that dies during `runc restore` (killed with the turnsnap that
// ran it: its death signal) leaves the container's state directory
// without state.json, so every later runc command says the container
// does not exist, and with criu-root in it: the container's root, which
// runc bind-mounts there for CRIU and unmounts only at the end, still
// mounted. `runc delete` then removes nothing, the next restore of that
// name is refused as existing, and the bind keeps the sandbox's root
// mounted. A fan-out killed while its branches' processes are restored
// side by side leaves one per restore in flight (TestKilledFanoutRecovers,
// engine).

// criuRootDir is where runc bind-mounts a restored container's root.
const criuRootDir = "criu-root"

// removeDeadState removes the state directory of container id if it is
// such a leftover (no state.json): it unmounts criu-root first and then
// removes only empty directories and plain files, never recursively, so
// a root still mounted there can never lose a file. A live container (its
// state.json present) is left alone.
func (r *Runtime) removeDeadState(id string) error {
	dir := filepath.Join(runcRoot(r.cfg.StateRoot), id)
	if _, err := os.Stat(filepath.Join(dir, "state.json")); !errors.Is(err, fs.ErrNotExist) {
		return nil // alive, or no directory at all
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("container %s: dead state: %w", id, err)
	}
	cr := filepath.Join(dir, criuRootDir)
	for range 8 { // a bind may be stacked; each unmount takes the top one
		mounted, err := mountinfo.Mounted(cr)
		if err != nil || !mounted {
			break
		}
		if err := unix.Unmount(cr, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("container %s: unmount %s a dead runc left: %w", id, cr, err)
		}
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			// A non-empty directory (something still mounted): keep it.
			return fmt.Errorf("container %s: dead state %s: %w", id, p, err)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("container %s: dead state: %w", id, err)
	}
	r.log.Info("removed the state a dead runc left", "container", id)
	return nil
}
