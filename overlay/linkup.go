package overlay

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/sys/mountinfo"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// lowerLinksFile caches the lower's hardlink groups in the sandbox
// directory: the lower never changes, and finding them walks all of it.
const lowerLinksFile = "lower.links"

// frozenLinksFile is the same for a stacked root's frozen layer.
const frozenLinksFile = "frozen.links"

// linkGroup is the names of one multiply-linked regular file of the lower
// and its file handle, as indexedFiles keys it.
type linkGroup struct {
	Handle string   `json:"handle"`
	Names  []string `json:"names"`
}

// lowerLinksState is the lowerLinksFile: the groups of one lower copy,
// named by the file handle of its root (a re-imported base has another).
type lowerLinksState struct {
	Lower  string      `json:"lower"`
	Groups []linkGroup `json:"groups"`
}

// lowerLinks returns every group of names that share one regular-file
// inode in the lower directory, computed once per sandbox and lower copy.
func (r *Root) lowerLinks() ([]linkGroup, error) { return r.linkGroups(r.lower, lowerLinksFile) }

// linkGroups is lowerLinks for any lower dir, cached in the sandbox
// directory's file cache.
func (r *Root) linkGroups(lower, cache string) ([]linkGroup, error) {
	fd, err := fsat.OpenDir(lower)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	id, err := lowerHandle(fd, "")
	if err != nil {
		return nil, err
	}
	p := filepath.Join(r.dir, cache)
	if data, err := os.ReadFile(p); err == nil {
		var st lowerLinksState
		if json.Unmarshal(data, &st) == nil && st.Lower == id {
			return st.Groups, nil
		}
	}
	// The backend's memo (linkmemo.go) spares a new sandbox the walk.
	groups, err := r.links.groups(lower, id, func() ([]linkGroup, error) { return walkGroups(fd, lower) })
	if err != nil {
		return nil, err
	}
	st := lowerLinksState{Lower: id, Groups: groups}
	data, _ := json.Marshal(st)
	if err := writeCacheFile(p, func(w *bufio.Writer) error { _, err := w.Write(data); return err }); err != nil {
		return nil, err
	}
	return st.Groups, nil
}

// walkGroups finds the hardlink groups of the lower dir open as fd by
// walking all of it.
func walkGroups(fd int, lower string) ([]linkGroup, error) {
	byIno := map[uint64][]string{}
	if err := walkLinks(fd, "", byIno); err != nil {
		return nil, fmt.Errorf("lower dir %s: %w", lower, err)
	}
	groups := []linkGroup{}
	for _, names := range byIno {
		if len(names) < 2 {
			continue // its other names are outside the lower
		}
		slices.Sort(names)
		h, err := lowerHandle(fd, names[0])
		if err != nil {
			return nil, err
		}
		groups = append(groups, linkGroup{Handle: h, Names: names})
	}
	slices.SortFunc(groups, func(a, b linkGroup) int { return strings.Compare(a.Names[0], b.Names[0]) })
	return groups, nil
}

func walkLinks(dirFD int, rel string, byIno map[uint64][]string) error {
	names, err := fsat.ReadDirNames(dirFD)
	if err != nil {
		return err
	}
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(dirFD, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		crel := path.Join(rel, n)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			if st.Nlink > 1 {
				byIno[st.Ino] = append(byIno[st.Ino], crel)
			}
		case unix.S_IFDIR:
			fd, err := fsat.Open(dirFD, n, unix.O_RDONLY|unix.O_DIRECTORY)
			if err != nil {
				return err
			}
			err = walkLinks(fd, crel, byIno)
			unix.Close(fd)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// linkUp makes every name of a copied-up base hardlink present in the
// upper of generation g. With index=on, copying up one name of a lower
// hardlink makes all its names show the upper inode (the index entry in
// the workdir, named by the lower inode's file handle, ties them), yet only
// the name written through is in the upper, and after it is deleted none
// is: the others would read as unchanged lower files to a scan of the
// upper. A no-op chown of each such name through the mount makes overlay
// link it up (its only effect is a ctime, which the format does not
// record), so the upper holds what the sandbox sees.
func (r *Root) linkUp(g string) error {
	mounted, err := mountinfo.Mounted(r.Path())
	if err != nil || !mounted {
		return err // nothing can have been copied up
	}
	groups, err := r.lowerLinks()
	if err != nil {
		return err
	}
	// A stacked generation's frozen layer has link groups of its own
	// (overlay/frozen); other layers' names of a shared inode are not in it.
	if s, err := readStack(g); err != nil {
		return err
	} else if s != nil {
		fg, err := r.linkGroups(s.Frozen, frozenLinksFile)
		if err != nil {
			return err
		}
		groups = append(groups, fg...)
	}
	if len(groups) == 0 {
		return nil
	}
	want := map[string]bool{}
	for _, grp := range groups {
		want[grp.Handle] = true
	}
	indexed, err := indexedFiles(filepath.Join(g, "work", "index"), want)
	if err != nil || len(indexed) == 0 {
		return err
	}
	upFD, err := fsat.OpenDir(filepath.Join(g, "upper"))
	if err != nil {
		return err
	}
	defer unix.Close(upFD)
	mountFD, err := fsat.OpenDir(r.Path())
	if err != nil {
		return err
	}
	defer unix.Close(mountFD)
	for _, grp := range groups {
		if !indexed[grp.Handle] {
			continue // not copied up: every name still shows the lower inode
		}
		for _, name := range grp.Names {
			var st unix.Stat_t
			if err := fsat.Lstat(upFD, name, &st); !errors.Is(err, unix.ENOENT) {
				continue // in the upper already, or a parent is whited out or replaced
			}
			pfd, base, err := fsat.OpenParent(mountFD, name)
			if err != nil {
				continue // the name's directory is gone or renamed in the sandbox
			}
			err = unix.Fchownat(pfd, base, -1, -1, unix.AT_SYMLINK_NOFOLLOW)
			unix.Close(pfd)
			if err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("link up %s: %w", name, err)
			}
		}
	}
	return nil
}

// indexedFiles returns which of the lower file handles want (type and
// bytes, hex) have a regular-file index entry. An entry's name is the hex
// of overlay's origin record: version, magic, length, flags, handle type,
// the lower filesystem's UUID (16 bytes), then the handle.
func indexedFiles(dir string, want map[string]bool) (map[string]bool, error) {
	fd, err := fsat.OpenDir(dir)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	names, err := fsat.ReadDirNames(fd)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, n := range names {
		if len(n) <= 2*21 || !strings.HasPrefix(n, "00fb") {
			continue
		}
		key := n[8:10] + ":" + n[2*21:]
		if !want[key] {
			continue
		}
		var st unix.Stat_t
		if unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue // a directory's entry, or a whiteout of a removed one
		}
		out[key] = true
	}
	return out, nil
}

// lowerHandle returns the file handle of rel in the lower in the form
// indexedFiles keys it.
func lowerHandle(lowerFD int, rel string) (string, error) {
	var h unix.FileHandle
	var err error
	if rel == "" {
		h, _, err = unix.NameToHandleAt(lowerFD, "", unix.AT_EMPTY_PATH)
	} else {
		pfd, base, oerr := fsat.OpenParent(lowerFD, rel)
		if oerr != nil {
			return "", oerr
		}
		defer unix.Close(pfd)
		h, _, err = unix.NameToHandleAt(pfd, base, 0)
	}
	if err != nil {
		return "", fmt.Errorf("file handle of lower %s: %w", rel, err)
	}
	return fmt.Sprintf("%02x:%s", h.Type(), hex.EncodeToString(h.Bytes())), nil
}
