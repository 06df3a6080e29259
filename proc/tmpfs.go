package proc

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/turnsnap/turnsnap/proc/criu"
)

// The container's tmpfs mounts (/dev and /dev/shm, see ocispec.Sandbox) live in
// its mount namespace, not in the sandbox root, so the filesystem scan never
// sees them: CRIU dumps their contents into the image. A command that wrote
// /dev/shm and exited changes no process, so Snapshot also digests every
// tmpfs mount (ProcSet.Tmpfs) and Changed compares the digests: such a turn
// is a process change, and its dump captures the files.

// maxTmpfsEntries bounds one digest walk; a mount with more entries reads
// as changed every turn (Truncated).
const maxTmpfsEntries = 100_000

// TmpfsState digests one tmpfs mount of a container.
type TmpfsState struct {
	// Mount is the mount point inside the container.
	Mount   string `json:"mount"`
	Entries int    `json:"entries"`
	Bytes   int64  `json:"bytes"`
	// Digest hashes every entry's path, type, mode, owner, and for regular
	// files size and mtime, for devices the device number, for symlinks the
	// target. Directory times are left out: creating and removing a file
	// leaves the same state.
	Digest    string `json:"digest"`
	Truncated bool   `json:"truncated,omitempty"`
}

// freshDev is what runc puts in a container's /dev (default devices, the
// standard links, and mount points). A /dev holding only these, and empty
// other tmpfs mounts, is pristine: a new container recreates it.
var freshDev = map[string]uint32{
	"null": unix.S_IFCHR, "zero": unix.S_IFCHR, "full": unix.S_IFCHR, "random": unix.S_IFCHR,
	"urandom": unix.S_IFCHR, "tty": unix.S_IFCHR,
	"ptmx": unix.S_IFLNK, "fd": unix.S_IFLNK, "stdin": unix.S_IFLNK, "stdout": unix.S_IFLNK,
	"stderr": unix.S_IFLNK, "core": unix.S_IFLNK,
	"pts": unix.S_IFDIR, "shm": unix.S_IFDIR, "mqueue": unix.S_IFDIR,
}

// readTmpfs digests every tmpfs mounted in host pid's mount namespace, and
// reports whether they are all pristine (see freshDev).
func readTmpfs(pid int) ([]TmpfsState, bool, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return nil, false, err
	}
	rootFD, err := unix.Open(fmt.Sprintf("/proc/%d/root", pid), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false, err
	}
	defer unix.Close(rootFD)
	var out []TmpfsState
	pristine := true
	for _, mnt := range tmpfsMounts(b) {
		st, fresh, err := digestMount(rootFD, mnt)
		if err != nil {
			return nil, false, fmt.Errorf("tmpfs %s: %w", mnt, err)
		}
		pristine = pristine && fresh
		out = append(out, st)
	}
	return out, pristine, nil
}

// tmpfsMounts lists the mount points of tmpfs mounts in a mountinfo text.
func tmpfsMounts(mountinfo []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint opts... - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 1 || g[0] != "tmpfs" {
			continue
		}
		// runc masks /proc and /sys paths with read-only tmpfs mounts and
		// binds of /dev/null (which mountinfo shows as tmpfs): not state.
		// The agent's own tmpfs is not sandbox state (AgentStateDir).
		if mp := unescapeMount(f[4]); !criu.PseudoFS(mp) && mp != AgentStateDir {
			out = append(out, mp)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// digestMount walks one mount (not into mounts below it) and digests it.
func digestMount(rootFD int, mnt string) (TmpfsState, bool, error) {
	st := TmpfsState{Mount: mnt}
	fd, err := unix.Openat2(rootFD, mnt, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return st, false, err
	}
	var top unix.Stat_t
	if err := unix.Fstat(fd, &top); err != nil {
		unix.Close(fd)
		return st, false, err
	}
	h := sha256.New()
	fresh := true
	var walk func(dirFD int, rel string) error
	walk = func(dirFD int, rel string) error {
		defer unix.Close(dirFD)
		names, err := readNames(dirFD)
		if err != nil {
			return err
		}
		for _, name := range names {
			if st.Entries >= maxTmpfsEntries {
				st.Truncated = true
				return nil
			}
			var s unix.Stat_t
			if err := unix.Fstatat(dirFD, name, &s, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				continue // removed meanwhile
			}
			p := rel + "/" + name
			if mnt+p == AgentStateDir && s.Dev != top.Dev {
				// The agent's tmpfs, mount point included (its root's mode
				// and owner are the agent's to change). A directory of that
				// name that is no mount is /dev's like any other file.
				continue
			}
			st.Entries++
			kind := s.Mode & unix.S_IFMT
			if mnt == "/dev" && rel == "" {
				fresh = fresh && freshDev[name] == kind
			} else if s.Dev == top.Dev {
				fresh = false
			}
			fmt.Fprintf(h, "%q %o %d %d", p, s.Mode, s.Uid, s.Gid)
			switch kind {
			case unix.S_IFREG:
				st.Bytes += s.Size
				fmt.Fprintf(h, " %d %d", s.Size, unix.TimespecToNsec(s.Mtim))
			case unix.S_IFCHR, unix.S_IFBLK:
				fmt.Fprintf(h, " %d", s.Rdev)
			case unix.S_IFLNK:
				buf := make([]byte, 4096)
				n, _ := unix.Readlinkat(dirFD, name, buf)
				fmt.Fprintf(h, " %q", buf[:max(n, 0)])
			case unix.S_IFDIR:
				if s.Dev != top.Dev {
					break // another mount (devpts, mqueue, a tmpfs of its own)
				}
				sub, err := unix.Openat(dirFD, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err != nil {
					continue
				}
				if err := walk(sub, p); err != nil {
					return err
				}
			}
			h.Write([]byte{'\n'})
		}
		return nil
	}
	if err := walk(fd, ""); err != nil {
		return st, false, err
	}
	st.Digest = hex.EncodeToString(h.Sum(nil))
	return st, fresh, nil
}

// readNames lists a directory's entries, sorted.
func readNames(dirFD int) ([]string, error) {
	dup, err := unix.Dup(dirFD)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return names, nil
}

// tmpfsChanges describes how two sets of tmpfs digests differ.
func tmpfsChanges(prev, cur []TmpfsState) []string {
	before := map[string]TmpfsState{}
	for _, t := range prev {
		before[t.Mount] = t
	}
	var why []string
	for _, c := range cur {
		p, ok := before[c.Mount]
		switch {
		case c.Truncated:
			why = append(why, fmt.Sprintf("tmpfs %s holds more than %d entries", c.Mount, maxTmpfsEntries))
		case !ok || p.Digest != c.Digest:
			why = append(why, fmt.Sprintf("tmpfs %s changed (%d entries, %d bytes)", c.Mount, c.Entries, c.Bytes))
		}
		delete(before, c.Mount)
	}
	for m := range before {
		why = append(why, fmt.Sprintf("tmpfs %s is gone", m))
	}
	slices.Sort(why)
	return why
}
