package proc

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/turnsnap/turnsnap/proc/criu"
)

// What a long-lived process references outside its memory: the files it
// holds open, maps (its executable, shared libraries, mmapped data), uses
// as cwd and root, and the bytes waiting in the pipes and sockets it holds.
// A CRIU image records all of them as they were at the dump, and a restore
// checks them against the files it finds (CRIU: "File data/log has bad size
// 49 (expect 6)"), so an image carried forward to a later checkpoint is
// only valid while none of them changed. Snapshot records them per process
// (Process.Refs) and Changed compares them.

// maxRefs bounds the references read per process: the first maxRefs fds
// and mapped files are compared, the rest are not (a server with tens of
// thousands of connections is busy anyway).
const maxRefs = 4096

// FileID is the version of one file: enough to tell that it was replaced
// (inode), rewritten (size, mtime) or chmod'ed (mode).
type FileID struct {
	Ino     uint64 `json:"ino,omitempty"`
	Mode    uint32 `json:"mode,omitempty"`
	Size    int64  `json:"size,omitempty"`
	MtimeNs int64  `json:"mtime,omitempty"`
	Missing bool   `json:"missing,omitempty"`
}

// fileID builds a FileID from a stat. Directories keep only their inode and
// type: a directory's size and mtime move whenever an entry in it does, and
// a process only needs its cwd to still be the same directory.
func fileID(st *unix.Stat_t) FileID {
	id := FileID{Ino: st.Ino, Mode: st.Mode}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		id.Size, id.MtimeNs = st.Size, unix.TimespecToNsec(st.Mtim)
	case unix.S_IFDIR:
		id.Mode = unix.S_IFDIR
	}
	return id
}

// Ref is one reference of a process.
type Ref struct {
	// Kind is fd, map, cwd, root or exe.
	Kind string `json:"kind"`
	// FD is the descriptor number of an fd reference.
	FD int `json:"fd,omitempty"`
	// Path is the file's path inside the container (with " (deleted)" when
	// it no longer has a name), or pipe:[INODE] / socket:[INODE].
	Path string `json:"path"`
	// Held is the file the process holds; AtPath what Path names in the
	// container now. They differ once the file was replaced or deleted.
	Held   FileID `json:"held"`
	AtPath FileID `json:"at_path"`
	// Queued is how many bytes wait to be read in a pipe or socket
	// (FIONREAD on a duplicate of the process's descriptor).
	Queued int `json:"queued,omitempty"`
	// SharedWrite marks a map reference with a shared writable mapping:
	// its stores reach the file with no write(2), so change events never
	// name them (the engine's change tracking walks while one exists).
	SharedWrite bool `json:"shared_write,omitempty"`
}

func (r Ref) key() string {
	if r.Kind == "fd" {
		return "fd " + strconv.Itoa(r.FD)
	}
	return r.Kind + " " + r.Path
}

// what names the reference for messages.
func (r Ref) what() string {
	switch r.Kind {
	case "fd":
		return fmt.Sprintf("fd %d (%s)", r.FD, r.Path)
	case "map":
		return "mapped " + r.Path
	}
	return r.Kind + " " + r.Path
}

// readRefs collects host pid's references. Anything unreadable is left
// out (the process may be exiting); what is read is compared next turn.
func readRefs(pid int) []Ref {
	base := fmt.Sprintf("/proc/%d/", pid)
	rootFD, err := unix.Open(base+"root", unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(rootFD)
	var refs []Ref
	for _, k := range []string{"exe", "cwd", "root"} {
		if r, ok := linkRef(rootFD, base+k, k); ok {
			refs = append(refs, r)
		}
	}
	refs = append(refs, fdRefs(pid, rootFD)...)
	refs = append(refs, mapRefs(pid, rootFD, maxRefs-len(refs))...)
	return refs
}

// linkRef reads one /proc magic link (exe, cwd, root, fd/N).
func linkRef(rootFD int, link, kind string) (Ref, bool) {
	target, err := os.Readlink(link)
	if err != nil {
		return Ref{}, false
	}
	r := Ref{Kind: kind, Path: target}
	var st unix.Stat_t
	if unix.Stat(link, &st) == nil { // follows the magic link to the held file
		r.Held = fileID(&st)
	}
	r.AtPath = statInRoot(rootFD, target)
	return r, true
}

// statInRoot stats path as the process would resolve it, inside its root
// (openat2 RESOLVE_IN_ROOT: a symlink in the sandbox cannot point the
// lookup at the host's files).
func statInRoot(rootFD int, path string) FileID {
	if !strings.HasPrefix(path, "/") || strings.HasSuffix(path, " (deleted)") {
		return FileID{Missing: true}
	}
	fd, err := unix.Openat2(rootFD, path, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return FileID{Missing: true}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return FileID{Missing: true}
	}
	return fileID(&st)
}

// fdRefs reads pid's open descriptors: files by identity, pipes and
// sockets by the bytes queued in them.
func fdRefs(pid, rootFD int) []Ref {
	dir := fmt.Sprintf("/proc/%d/fd/", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	pidfd := -1
	defer func() {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
	}()
	var refs []Ref
	for _, e := range ents {
		if len(refs) >= maxRefs {
			break
		}
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		target, err := os.Readlink(dir + e.Name())
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(target, "/"):
			if criu.PseudoFS(target) {
				continue
			}
			r, ok := linkRef(rootFD, dir+e.Name(), "fd")
			if !ok {
				continue
			}
			r.FD = n
			if k := r.Held.Mode & unix.S_IFMT; k == unix.S_IFIFO || k == unix.S_IFSOCK {
				// A named pipe: its bytes live in the pipe, not the file.
				if pidfd < 0 {
					if pidfd, err = unix.PidfdOpen(pid, 0); err != nil {
						pidfd = -1
					}
				}
				if pidfd >= 0 {
					r.Queued = queued(pidfd, n)
				}
			}
			refs = append(refs, r)
		case strings.HasPrefix(target, "pipe:"), strings.HasPrefix(target, "socket:"):
			if pidfd < 0 {
				if pidfd, err = unix.PidfdOpen(pid, 0); err != nil {
					pidfd = -1
					continue
				}
			}
			refs = append(refs, Ref{Kind: "fd", FD: n, Path: target, Queued: queued(pidfd, n)})
		}
	}
	return refs
}

// queued returns how many bytes wait to be read in descriptor fd of the
// process behind pidfd, through a duplicate of it (pidfd_getfd): reading
// the count neither wakes the process nor takes the bytes. Listening
// sockets have no byte queue (EINVAL) and count as 0.
func queued(pidfd, fd int) int {
	dup, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(dup)
	n, err := unix.IoctlGetInt(dup, unix.SIOCINQ) // FIONREAD: same request for pipes and sockets
	if err != nil {
		return 0
	}
	return n
}

// mapRefs reads pid's file mappings (executable, libraries, mmapped
// files), one reference per file.
func mapRefs(pid, rootFD, room int) []Ref {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil || room <= 0 {
		return nil
	}
	seen := map[string]bool{}
	var refs []Ref
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() && len(refs) < room {
		// start-end perms offset dev inode path
		f := strings.SplitN(sc.Text(), " ", 6)
		if len(f) < 6 {
			continue
		}
		path := strings.TrimLeft(f[5], " ")
		shared := len(f[1]) == 4 && f[1][1] == 'w' && f[1][3] == 's'
		if !strings.HasPrefix(path, "/") || criu.PseudoFS(path) {
			continue
		}
		if seen[path] {
			if i := slices.IndexFunc(refs, func(r Ref) bool { return r.Path == path }); shared && i >= 0 {
				refs[i].SharedWrite = true
			}
			continue
		}
		seen[path] = true
		r := Ref{Kind: "map", Path: path, AtPath: statInRoot(rootFD, path), SharedWrite: shared}
		var st unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/map_files/%s", pid, mapFilesName(f[0])), &st) == nil {
			r.Held = fileID(&st)
		}
		refs = append(refs, r)
	}
	return refs
}

// mapFilesName turns a maps range ("00400000-00600000") into its
// map_files entry name, which has no leading zeros ("400000-600000").
func mapFilesName(rng string) string {
	a, b, _ := strings.Cut(rng, "-")
	x, err1 := strconv.ParseUint(a, 16, 64)
	y, err2 := strconv.ParseUint(b, 16, 64)
	if err1 != nil || err2 != nil {
		return rng
	}
	return fmt.Sprintf("%x-%x", x, y)
}

// refChanges describes how the references of one process differ between
// two snapshots, or returns nil when they do not.
func refChanges(prev, cur []Ref) []string {
	before := make(map[string]Ref, len(prev))
	for _, r := range prev {
		before[r.key()] = r
	}
	var why []string
	seen := make(map[string]bool, len(cur))
	for _, c := range cur {
		k := c.key()
		seen[k] = true
		p, ok := before[k]
		switch {
		case !ok:
			why = append(why, "now holds "+c.what())
		case p.Path != c.Path:
			why = append(why, fmt.Sprintf("%s now names %s", p.what(), c.Path))
		case p.Queued != c.Queued:
			why = append(why, fmt.Sprintf("has %d bytes waiting in %s (were %d)", c.Queued, c.what(), p.Queued))
		case p.Held != c.Held || p.AtPath != c.AtPath:
			why = append(why, fmt.Sprintf("uses %s, which %s", c.what(), fileChange(p, c)))
		}
	}
	for _, p := range prev {
		if !seen[p.key()] {
			why = append(why, "no longer holds "+p.what())
		}
	}
	return why
}

func fileChange(p, c Ref) string {
	switch {
	case c.AtPath.Missing && !p.AtPath.Missing:
		return "was deleted"
	case p.AtPath.Ino != c.AtPath.Ino:
		return fmt.Sprintf("was replaced (inode %d, was %d)", c.AtPath.Ino, p.AtPath.Ino)
	case p.Held.Size != c.Held.Size || p.AtPath.Size != c.AtPath.Size:
		return fmt.Sprintf("changed size (%d bytes, was %d)", c.AtPath.Size, p.AtPath.Size)
	case p.Held.Mode != c.Held.Mode || p.AtPath.Mode != c.AtPath.Mode:
		return fmt.Sprintf("changed mode (%o, was %o)", c.AtPath.Mode, p.AtPath.Mode)
	}
	return "was modified"
}
