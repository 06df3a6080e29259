package upload

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// List walks only the directory named by prefix up to its last slash, so
// listing "packs/ab" reads dir/packs and never the rest of the store.
func (s *localStore) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	if err := checkPrefix(prefix); err != nil {
		return err
	}
	dir, _ := splitPrefix(prefix)
	return s.walk(ctx, dir, prefix, fn)
}

// listItem is a directory entry keyed by the name it contributes to the
// listing: an object's name, or a directory's name with a trailing slash.
type listItem struct {
	key string
	ent fs.DirEntry
}

// walk lists the objects under rel ("" or a directory name ending in "/")
// whose names start with prefix.
//
// Sorting each directory's entries by key, not by file name, is what keeps
// the listing in lexical order of full names: "a.x" sorts before "a/b"
// because '.' < '/', yet a walk by file name would visit directory "a"
// before file "a.x".
func (s *localStore) walk(ctx context.Context, rel, prefix string, fn func(ObjectInfo) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("list %q: %w", prefix, err)
	}
	ents, err := os.ReadDir(filepath.Join(s.dir, filepath.FromSlash(rel)))
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %q: %w", prefix, err)
	}
	items := make([]listItem, 0, len(ents))
	for _, e := range ents {
		if checkComponent(e.Name()) != "" || rel == "" && e.Name() == tmpDir {
			continue // not something Put could have made
		}
		key := rel + e.Name()
		switch {
		case e.IsDir():
			key += "/"
			if !strings.HasPrefix(key, prefix) && !strings.HasPrefix(prefix, key) {
				continue
			}
		case !e.Type().IsRegular() || !strings.HasPrefix(key, prefix):
			continue
		}
		items = append(items, listItem{key, e})
	}
	slices.SortFunc(items, func(a, b listItem) int { return strings.Compare(a.key, b.key) })
	for _, it := range items {
		if it.ent.IsDir() {
			if err := s.walk(ctx, it.key, prefix, fn); err != nil {
				return err
			}
			continue
		}
		info, err := it.ent.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted since ReadDir
		}
		if err != nil {
			return fmt.Errorf("object %s: %w", it.key, err)
		}
		if err := fn(ObjectInfo{Name: it.key, Size: info.Size(), ModTime: info.ModTime()}); err != nil {
			return err
		}
	}
	return nil
}
