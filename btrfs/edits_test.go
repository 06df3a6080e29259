package btrfs

import (
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var names = []string{"a", "b", "c", "d", "n1", "n2", "x", "y"}

func randomBase(t testing.TB, rng *rand.Rand) string {
	t.Helper()
	dir := t.TempDir()
	for i := range 40 {
		d := filepath.Join(dir, names[rng.Intn(4)], names[rng.Intn(len(names))])
		if rng.Intn(3) == 0 {
			d = filepath.Join(d, names[rng.Intn(len(names))])
		}
		must(t, os.MkdirAll(d, 0o755))
		p := filepath.Join(d, fmt.Sprintf("f%d", i))
		must(t, os.WriteFile(p, randomBytes(rng), 0o644))
		if i%7 == 0 {
			must(t, unix.Setxattr(p, "user.base", []byte{byte(i)}, 0))
		}
		if i%9 == 0 {
			ld := filepath.Join(dir, names[rng.Intn(4)])
			must(t, os.MkdirAll(ld, 0o755))
			must(t, os.Link(p, filepath.Join(ld, fmt.Sprintf("link%d", i))))
		}
	}
	must(t, os.Symlink("a", filepath.Join(dir, "sym")))
	must(t, unix.Mkfifo(filepath.Join(dir, "a", "fifo"), 0o644))
	return dir
}

func someBytes(rng *rand.Rand, max int) []byte {
	b := make([]byte, 1+rng.Intn(max))
	rng.Read(b)
	return b
}

func randomBytes(rng *rand.Rand) []byte {
	n := rng.Intn(3000)
	if rng.Intn(10) == 0 {
		n = 70 << 10 // several chunks
	}
	b := make([]byte, n)
	rng.Read(b)
	return b
}

// listing returns every path below root (files and directories), sorted.
func listing(t testing.TB, root string) (files, dirs []string) {
	t.Helper()
	dirs = []string{""}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case rel == ".":
		case d.IsDir():
			dirs = append(dirs, rel)
		default:
			files = append(files, rel)
		}
		return nil
	})
	must(t, err)
	return files, dirs
}

func pick(rng *rand.Rand, s []string) string { return s[rng.Intn(len(s))] }

// randomEdit makes one random change below root. Edits that the state
// forbids (renaming a directory into itself, ...) fail harmlessly.
func randomEdit(t testing.TB, rng *rand.Rand, root string) {
	t.Helper()
	files, dirs := listing(t, root)
	p := func(rel string) string { return filepath.Join(root, rel) }
	newName := func() string { return filepath.Join(pick(rng, dirs), pick(rng, names)) }
	regular := func() (string, bool) {
		for range 10 {
			if len(files) == 0 {
				return "", false
			}
			f := pick(rng, files)
			if fi, err := os.Lstat(p(f)); err == nil && fi.Mode().IsRegular() {
				return f, true
			}
		}
		return "", false
	}
	some := func() string {
		all := append(append([]string{}, files...), dirs[1:]...)
		if len(all) == 0 {
			return ""
		}
		return pick(rng, all)
	}
	switch op := rng.Intn(18); op {
	case 0: // create a file
		os.WriteFile(p(newName()), randomBytes(rng), 0o644)
	case 1: // write in place
		if f, ok := regular(); ok {
			fh, err := os.OpenFile(p(f), os.O_WRONLY, 0)
			if err == nil {
				fh.WriteAt(someBytes(rng, 100), int64(rng.Intn(200)))
				fh.Close()
			}
		}
	case 2: // replace through a rename
		if f, ok := regular(); ok {
			tmp := p(f) + ".tmp"
			os.WriteFile(tmp, randomBytes(rng), 0o640)
			os.Rename(tmp, p(f))
		}
	case 3: // delete a file
		if len(files) > 0 {
			os.Remove(p(pick(rng, files)))
		}
	case 4: // make a directory
		os.Mkdir(p(newName()), 0o755)
	case 5: // remove a directory tree
		if len(dirs) > 1 && rng.Intn(2) == 0 {
			os.RemoveAll(p(pick(rng, dirs[1:])))
		}
	case 6: // rename a file, maybe over another
		if len(files) > 0 {
			os.Rename(p(pick(rng, files)), p(newName()))
		}
	case 7: // rename a directory
		if len(dirs) > 1 {
			src, dst := pick(rng, dirs[1:]), newName()
			if !strings.HasPrefix(dst+"/", src+"/") {
				os.Rename(p(src), p(dst))
			}
		}
	case 8: // hardlink
		if f, ok := regular(); ok {
			os.Link(p(f), p(newName()))
		}
	case 9: // symlink
		os.Symlink(pick(rng, names), p(newName()))
	case 10: // mode
		if s := some(); s != "" {
			os.Lchown(p(s), 0, 0)
			if fi, err := os.Lstat(p(s)); err == nil && fi.Mode()&os.ModeSymlink == 0 {
				os.Chmod(p(s), []os.FileMode{0o755, 0o700, 0o644, 0o600}[rng.Intn(4)])
			}
		}
	case 11: // owner
		if s := some(); s != "" {
			os.Lchown(p(s), rng.Intn(3)*1000, rng.Intn(3)*1000)
		}
	case 12: // mtime
		if s := some(); s != "" {
			ts := time.Unix(int64(1600000000+rng.Intn(1000)), int64(rng.Intn(1e9)))
			unix.UtimesNanoAt(unix.AT_FDCWD, p(s), []unix.Timespec{unix.NsecToTimespec(ts.UnixNano()), unix.NsecToTimespec(ts.UnixNano())}, unix.AT_SYMLINK_NOFOLLOW)
		}
	case 13: // xattr set or removed
		if s := some(); s != "" {
			if rng.Intn(2) == 0 {
				unix.Lsetxattr(p(s), "user."+pick(rng, names), someBytes(rng, 20), 0)
			} else {
				unix.Lremovexattr(p(s), "user.base")
			}
		}
	case 14: // a temp file that comes and goes
		tmp := p(newName()) + ".swp"
		if os.WriteFile(tmp, []byte("tmp"), 0o600) == nil {
			os.Remove(tmp)
		}
	case 15: // a directory replaced by a file, or a file by a directory
		if s := some(); s != "" {
			os.RemoveAll(p(s))
			if rng.Intn(2) == 0 {
				os.WriteFile(p(s), randomBytes(rng), 0o644)
			} else {
				os.Mkdir(p(s), 0o755)
			}
		}
	case 16: // rewrite with the same bytes
		if f, ok := regular(); ok {
			if data, err := os.ReadFile(p(f)); err == nil {
				os.WriteFile(p(f), data, 0o644)
			}
		}
	case 17: // unlink one name of a multi-link file
		for _, f := range files {
			var st unix.Stat_t
			if unix.Lstat(p(f), &st) == nil && st.Nlink > 1 && st.Mode&unix.S_IFMT == unix.S_IFREG {
				os.Remove(p(f))
				break
			}
		}
	}
}
