package harness

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/turnsnap/turnsnap/bench/trace"
)

// snapshot is what state equivalence compares: the tree's digest and each
// running process's probe answer.
type snapshot struct {
	Digest string
	Probes map[string]probeAnswer // by process name
}

type probeAnswer struct {
	Cmd trace.Command
	Out string
}

// skipTop are the container's mount points: not the sandbox's files.
var skipTop = map[string]bool{"proc": true, "dev": true, "sys": true, "tmp": true, "run": true}

// TreeDigest hashes every path under root (but the mount points above):
// name, type, permissions, owner, size, content, link target and a
// regular file's mtime.
func TreeDigest(root string) (string, error) {
	h := sha256.New()
	var paths []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if top, _, _ := strings.Cut(rel, string(filepath.Separator)); skipTop[top] && rel != top {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if rel != "." {
			paths = append(paths, rel)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(paths)
	for _, rel := range paths {
		p := filepath.Join(root, rel)
		fi, err := os.Lstat(p)
		if err != nil {
			return "", err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		var uid, gid uint32
		if st != nil {
			uid, gid = st.Uid, st.Gid
		}
		mtime, size := fi.ModTime().UnixNano(), fi.Size()
		if fi.IsDir() {
			size = 0 // a directory's size is the filesystem's business
		}
		if !fi.Mode().IsRegular() {
			mtime = 0 // a directory's moves with the runtime's own mount points; a link's is not restorable through os
		}
		fmt.Fprintf(h, "%s\x00%v\x00%d:%d\x00%d\x00%d\x00", rel, fi.Mode(), uid, gid, size, mtime)
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			t, _ := os.Readlink(p)
			io.WriteString(h, t)
		case fi.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return "", err
			}
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return "", err
			}
		}
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func (h *Harness) rootDigest(ctx context.Context, name string) (string, error) {
	p, err := h.c.SandboxPath(ctx, name)
	if err != nil {
		return "", err
	}
	return TreeDigest(p.Root)
}

// snapshot records the state right after a checkpoint.
func (h *Harness) snapshot(ctx context.Context, name string, t *trace.Trace, procs procState) (*snapshot, error) {
	d, err := h.rootDigest(ctx, name)
	if err != nil {
		return nil, err
	}
	s := &snapshot{Digest: d, Probes: map[string]probeAnswer{}}
	for pname := range procs {
		found := findProbe(t, pname)
		if found == nil {
			continue
		}
		probe := *found
		probe.Cmd, probe.Cwd = inDir(t.Dir(probe.Cwd), probe.Cmd), ""
		code, out, err := h.sh(ctx, name, probe.Cmd, probe.Timeout(10*time.Second))
		if err != nil {
			return nil, err
		}
		if code != 0 {
			return nil, fmt.Errorf("probe of %s exits %d before the crash: %s", pname, code, out)
		}
		s.Probes[pname] = probeAnswer{Cmd: probe, Out: out}
	}
	return s, nil
}

// equivalent compares the restored state with want.
func (h *Harness) equivalent(ctx context.Context, name string, want *snapshot) (bool, string) {
	d, err := h.rootDigest(ctx, name)
	if err != nil {
		return false, err.Error()
	}
	if d != want.Digest {
		return false, fmt.Sprintf("tree digest %s, at the checkpoint %s", d[:12], want.Digest[:12])
	}
	for pname, pr := range want.Probes {
		code, out, err := h.sh(ctx, name, pr.Cmd.Cmd, pr.Cmd.Timeout(10*time.Second))
		switch {
		case err != nil:
			return false, fmt.Sprintf("probe of %s: %v", pname, err)
		case code != 0:
			return false, fmt.Sprintf("probe of %s exits %d after the restore: %s", pname, code, out)
		case out != pr.Out:
			return false, fmt.Sprintf("probe of %s answers %q after the restore, %q at the checkpoint", pname, out, pr.Out)
		}
	}
	return true, ""
}

func findProbe(t *trace.Trace, name string) *trace.Command {
	var probe *trace.Command
	for _, turn := range t.Turns {
		for _, st := range turn.Plan() {
			if st.Start != nil && st.Start.Name == name {
				probe = st.Start.Probe // the latest start of that name
			}
		}
	}
	return probe
}
