package overlay

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/moby/sys/mountinfo"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// lowerLinksFile caches the lower's hardlink groups in the sandbox
// directory: the lower never changes, and finding them walks all of it.
const lowerLinksFile = "lower.links"

// lowerLinks returns every group of names that share one regular-file
// inode in the lower directory, each sorted, computed once per sandbox.
func (r *Root) lowerLinks() ([][]string, error) {
	p := filepath.Join(r.dir, lowerLinksFile)
	if data, err := os.ReadFile(p); err == nil {
		var groups [][]string
		if json.Unmarshal(data, &groups) == nil {
			return groups, nil
		}
	}
	fd, err := fsat.OpenDir(r.lower)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	byIno := map[uint64][]string{}
	if err := walkLinks(fd, "", byIno); err != nil {
		return nil, fmt.Errorf("lower dir %s: %w", r.lower, err)
	}
	groups := [][]string{}
	for _, names := range byIno {
		if len(names) > 1 {
			slices.Sort(names)
			groups = append(groups, names)
		}
	}
	slices.SortFunc(groups, func(a, b []string) int { return cmpStr(a[0], b[0]) })
	data, _ := json.Marshal(groups)
	if err := writeCacheFile(p, func(w *bufio.Writer) error { _, err := w.Write(data); return err }); err != nil {
		return nil, err
	}
	return groups, nil
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
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
// upper. With index=on, copying up one name of a lower hardlink makes all
// its names show the upper inode (the index entry ties them), yet only the
// copied name is in the upper: the others would read as unchanged lower
// files to a scan of the upper. A no-op chown of each such name through the
// mount makes overlay link it up (its only effect is a ctime, which the
// format does not record), so the upper holds the link the sandbox sees.
func (r *Root) linkUp(upper string) error {
	mounted, err := mountinfo.Mounted(r.Path())
	if err != nil || !mounted {
		return err // nothing can have been copied up
	}
	groups, err := r.lowerLinks()
	if err != nil || len(groups) == 0 {
		return err
	}
	upFD, err := fsat.OpenDir(upper)
	if err != nil {
		return err
	}
	defer unix.Close(upFD)
	mountFD := -1
	defer func() {
		if mountFD >= 0 {
			unix.Close(mountFD)
		}
	}()
	buf := make([]byte, fsat.XattrBufSize)
	for _, g := range groups {
		var absent []string
		copied := false
		for _, name := range g {
			fd, err := fsat.Open(upFD, name, unix.O_PATH)
			if errors.Is(err, unix.ENOENT) {
				absent = append(absent, name)
				continue
			}
			if err != nil {
				continue // an ancestor is a whiteout or replaced: the name is gone
			}
			var st unix.Stat_t
			if unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
				_, xerr := unix.Getxattr("/proc/self/fd/"+strconv.Itoa(fd), originXattr, buf)
				copied = copied || xerr == nil
			}
			unix.Close(fd)
		}
		if !copied || len(absent) == 0 {
			continue
		}
		if mountFD < 0 {
			if mountFD, err = fsat.OpenDir(r.Path()); err != nil {
				return err
			}
		}
		for _, name := range absent {
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
