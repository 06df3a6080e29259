// Package lazy restores a writable layer without waiting for its bytes:
// the layer's tree is written as placeholder files (right size, mode,
// owner, xattrs and mtime, no data block, a marker xattr), and a fanotify
// group of the pre-content class holds every first open of one until its
// chunks are fetched, verified and written (docs/STORAGE.md, "Lazy
// restore").
//
// Measured on this kernel (6.18; overlay/lazy/probe): pre-content marks
// are refused on overlayfs itself and on tmpfs (EOPNOTSUPP) and accepted on
// ext4 and btrfs. An access through an overlay mount to an upper-layer file
// is reported on the upper's filesystem (the backing file): FAN_OPEN_PERM
// at open, FAN_PRE_ACCESS at read, write and truncate, for inode marks and
// filesystem marks alike (a mount mark on the upper's mount sees nothing:
// overlay reaches the upper through a private clone of it). An mmap through
// the overlay reports nothing (overlay maps the backing file without the
// pre-content hook), where mmap on ext4 directly reports FAN_PRE_ACCESS. So
// a placeholder is filled at its first open (FAN_OPEN_PERM), which every
// read, mmap and exec goes through, and FAN_PRE_ACCESS covers truncate(2)
// by path, which opens nothing.
package lazy

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"golang.org/x/sys/unix"
)

// MarkerXattr marks a placeholder on disk; its value is the file's path in
// the layer's tree (relative, as fstree names it), so a restarted daemon
// finds the entry to fetch even after the file was renamed. Filling a file
// removes it (fstree.SetFileMeta removes every xattr the entry lacks).
const MarkerXattr = "trusted.turnsnap.lazy"

// StateFile, in a root's directory, says that root's layer is not whole
// yet: it names the tree being filled. It is written (and synced) before
// the first placeholder and removed only after the last file is filled and
// synced, so a root found with it after a crash is incomplete.
const StateFile = "lazy-restore"

// State file contents: the tree, then "ready" once every placeholder is
// made and its marker set (before that, a crash leaves a layer that must
// be made again rather than filled).
const readyWord = "ready"

// keeperWord prefixes the keeper's pid in the state file.
const keeperWord = "keeper="

// writeState records that the layer of the root in dir is being filled
// from tree, ready or not, and the keeper process holding its group (0:
// none).
func writeState(dir string, tree delta.ID, ready bool, keeper int) error {
	p := filepath.Join(dir, StateFile)
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	text := tree.String() + "\n"
	if ready {
		text += readyWord + "\n"
	}
	if keeper > 0 {
		text += fmt.Sprintf("%s%d\n", keeperWord, keeper)
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		return err
	}
	return syncDir(dir)
}

// State is what the state file of a root says.
type State struct {
	// Incomplete: the file exists, the layer is not whole.
	Incomplete bool
	// Tree is the layer being filled.
	Tree delta.ID
	// Ready: every placeholder was made and marked, so Recover can finish
	// the fill; otherwise the layer must be made again.
	Ready bool
	// Keeper is the pid of the process that held the group's descriptor
	// (Config.Keeper), 0 if none.
	Keeper int
}

// ReadState reads the state file of the root in dir.
func ReadState(dir string) (State, error) {
	p := filepath.Join(dir, StateFile)
	b, err := os.ReadFile(p)
	if os.IsNotExist(err) {
		return State{}, nil
	}
	if err != nil {
		return State{}, err
	}
	lines := strings.Fields(string(b))
	if len(lines) == 0 || len(lines) > 3 {
		return State{}, fmt.Errorf("%s: not a lazy restore state", p)
	}
	id, err := delta.ParseID(lines[0])
	if err != nil {
		return State{}, fmt.Errorf("%s: %w", p, err)
	}
	st := State{Incomplete: true, Tree: id}
	for _, l := range lines[1:] {
		switch {
		case l == readyWord:
			st.Ready = true
		case strings.HasPrefix(l, keeperWord):
			if st.Keeper, err = strconv.Atoi(strings.TrimPrefix(l, keeperWord)); err != nil || st.Keeper <= 0 {
				return State{}, fmt.Errorf("%s: keeper %q", p, l)
			}
		default:
			return State{}, fmt.Errorf("%s: not a lazy restore state", p)
		}
	}
	return st, nil
}

// clearState says the root in dir is whole.
func clearState(dir string) error {
	if err := os.Remove(filepath.Join(dir, StateFile)); err != nil && !os.IsNotExist(err) {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// placeholders writes the filler's tree (a writable layer in overlay upper
// form) into its upper, an existing empty directory, with every file a
// placeholder that f marks and will fill. Directories, symlinks,
// whiteouts, devices and hardlinks are made whole, as a restore makes them.
func placeholders(ctx context.Context, f *Filler) (fstree.ApplyStats, error) {
	return fstree.Materialise(ctx, f.cfg.Tree, f.cfg.Upper, fstree.ApplyOptions{
		Loader: f.cfg.Loader, IDs: f.cfg.IDs, AllowDevices: f.cfg.AllowDevices,
		// A placeholder is a create and its metadata, all system time:
		// one writer per CPU (at least two) beside the walk.
		// BenchmarkScaleLazyRestore measures what it buys.
		Workers: cmp.Or(f.cfg.Writers, fstree.ParallelWorkers()),
		Placeholder: func(rel string, e *delta.Entry, fd int) error {
			if err := unix.Fsetxattr(fd, MarkerXattr, []byte(rel), 0); err != nil {
				return fmt.Errorf("mark placeholder: %w", err)
			}
			return f.add(rel, e, fd)
		},
	})
}
