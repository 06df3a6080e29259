package lazy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"path/filepath"

	"github.com/turnsnap/turnsnap/delta"
	"golang.org/x/sys/unix"
)

// ErrNotReady says a root's placeholders were not all made before a crash:
// the layer must be made again (remove the upper's contents, Restore).
var ErrNotReady = errors.New("lazy restore interrupted before its placeholders were made")

// Recover takes over a layer a killed process left incomplete (its state
// file says ready): every file still carrying the marker is marked again
// and will be filled, from the start (a fill cut short left its marker, so
// no half-written file is ever taken for whole). Files filled before the
// crash are left as they are.
func Recover(ctx context.Context, cfg Config) (*Filler, error) {
	st, err := ReadState(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", cfg.Sandbox, err)
	}
	if !st.Incomplete {
		return nil, fmt.Errorf("sandbox %s: no lazy restore to recover", cfg.Sandbox)
	}
	if !st.Ready {
		return nil, fmt.Errorf("sandbox %s: %w", cfg.Sandbox, ErrNotReady)
	}
	cfg.Tree = st.Tree
	files, err := fileEntries(ctx, cfg.Loader, st.Tree)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: lazy restore of %s: %w", cfg.Sandbox, st.Tree.Short(), err)
	}
	var (
		k  *keeper
		fd = -1
	)
	if cfg.Keeper && st.Keeper > 0 {
		// The group the dead process used, with its marks: accesses made
		// since wait on it, and are answered from here on.
		if k, fd, err = adoptKeeper(st.Keeper); err != nil {
			log := cfg.Log
			if log == nil {
				log = slog.Default()
			}
			log.Warn("lazy restore: keeper not taken over; a new group", "sandbox", cfg.Sandbox, "err", err)
		}
	}
	f, err := newFiller(cfg, fd)
	if err != nil {
		if k != nil {
			k.stop()
		}
		return nil, err
	}
	f.keeper = k
	if cfg.Keeper && k == nil {
		if f.keeper, err = startKeeper(f.gfd); err != nil {
			f.Close()
			return nil, fmt.Errorf("sandbox %s: lazy restore: %w", cfg.Sandbox, err)
		}
	}
	buf := make([]byte, 4096)
	err = filepath.WalkDir(cfg.Upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		n, err := unix.Lgetxattr(p, MarkerXattr, buf)
		if errors.Is(err, unix.ENODATA) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		rel := string(buf[:n])
		e, ok := files[rel]
		if !ok {
			return fmt.Errorf("%s: placeholder for /%s, which tree %s has no file at", p, rel, st.Tree.Short())
		}
		return f.addAt(rel, e, unix.AT_FDCWD, p)
	})
	if err == nil {
		err = f.markReady()
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox %s: lazy restore recovery: %w", cfg.Sandbox, err)
	}
	return f, nil
}

// fileEntries returns every regular file entry of tree by path.
func fileEntries(ctx context.Context, loader delta.BlobLoader, tree delta.ID) (map[string]*delta.Entry, error) {
	out := map[string]*delta.Entry{}
	var walk func(id delta.ID, rel string) error
	walk = func(id delta.ID, rel string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		t, err := delta.LoadTree(ctx, loader, id)
		if err != nil {
			return err
		}
		for i := range t.Entries {
			e := &t.Entries[i]
			p := path.Join(rel, e.Name)
			switch e.Type {
			case delta.TypeFile:
				out[p] = e
			case delta.TypeDir:
				if err := walk(e.Subtree, p); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return out, walk(tree, "")
}
