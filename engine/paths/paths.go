// Package paths works one path at a time: read a file or a directory
// listing out of any checkpoint (Cat, Ls), and put chosen paths of a
// checkpoint back into a live sandbox or a host directory (RestorePaths).
// Paths are in-sandbox ("/etc/app.conf" or "etc/app.conf"); ".." is
// refused, never resolved.
package paths

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"time"
	"unicode/utf8"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/fstree/pathrestore"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// Deps is what the path operations need of the engine. Blobs and IDs are
// function values: key changes and rebuilds replace them under the
// engine's exclusive lock, and they are read at each call, under the
// shared one.
type Deps struct {
	Log *slog.Logger
	// View runs fn in a catalog transaction.
	View func(ctx context.Context, fn func(tx *catalog.Tx) error) error
	// Blobs reads trees and file contents; IDs is the home's content ID
	// scheme.
	Blobs func() delta.BlobLoader
	IDs   func() delta.IDs
	// Shared holds the engine's maintenance lock shared until release.
	Shared func() (release func())
	// Op holds sandbox name's operation lock (and Shared) until done: no
	// checkpoint of the sandbox runs meanwhile.
	Op func(ctx context.Context, name delta.SandboxName) (done func(), err error)
	// Resolve turns a checkpoint reference into a checkpoint, for a
	// command about sandbox name ("" if none): HEAD is its head.
	Resolve func(ctx context.Context, name delta.SandboxName, ref catalog.CheckpointRef) (*delta.Checkpoint, error)
	// LiveRoot loads sandbox name (finishing interrupted work), mounts its
	// root and returns the root's path. Called under Op.
	LiveRoot func(ctx context.Context, name string) (string, error)
}

// Ops reads and restores paths of checkpoints. It keeps no state: the
// engine makes one for each call.
type Ops struct {
	d Deps
}

// New returns the path operations over d.
func New(d Deps) *Ops { return &Ops{d: d} }

// b64 is the raw bytes of s, base64 (standard, padded), when s is not
// valid UTF-8: JSON strings cannot carry such names losslessly (encoding/json
// writes U+FFFD), so results carry both (README, "For scripts").
func b64(s string) string {
	if utf8.ValidString(s) {
		return ""
	}
	return base64.StdEncoding.EncodeToString([]byte(s))
}

// stateOf resolves ref (for a command about sandbox name, "" if none) and
// returns the checkpoint and its merged state.
func (ps *Ops) stateOf(ctx context.Context, name delta.SandboxName, ref catalog.CheckpointRef) (*delta.Checkpoint, delta.Layers, error) {
	cp, err := ps.d.Resolve(ctx, name, ref)
	if err != nil {
		return nil, nil, err
	}
	return cp, delta.Layers{cp.BaseTree, cp.FSTree}, nil
}

// Cat writes the content of the file at path in checkpoint ref to w. Every
// chunk is checked against its hash as it is read; a damaged one fails with
// ErrCorrupt naming the object, after w got the bytes before it, so a
// caller streaming w elsewhere must treat any error as "incomplete". A
// hardlink is read through its primary. Directories, symlinks and special
// files are ErrInvalid (saying what the path is), a missing path
// ErrNotFound.
func (ps *Ops) Cat(ctx context.Context, ref catalog.CheckpointRef, path string, w io.Writer) error {
	defer ps.d.Shared()()
	cp, l, err := ps.stateOf(ctx, "", ref)
	if err != nil {
		return err
	}
	rel, err := pathrestore.CleanPath(path)
	if err != nil {
		return err
	}
	where := fmt.Sprintf("checkpoint %s: /%s", cp.ID.Short(), rel)
	ent := delta.Entry{Type: delta.TypeDir}
	if rel != "" {
		var ok bool
		if ent, ok, err = delta.Lookup(ctx, ps.d.Blobs(), l, rel); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		} else if !ok {
			return fmt.Errorf("%s: no such file: %w", where, errdefs.ErrNotFound)
		}
	}
	switch ent.Type {
	case delta.TypeFile:
	case delta.TypeDir:
		return fmt.Errorf("%s is a directory (list it with `turnsnap ls`): %w", where, errdefs.ErrInvalid)
	case delta.TypeSymlink:
		return fmt.Errorf("%s is a symlink to %q, not a file: %w", where, ent.Target, errdefs.ErrInvalid)
	default:
		return fmt.Errorf("%s is a %s, not a file: %w", where, ent.Type, errdefs.ErrInvalid)
	}
	if _, err := pathrestore.StreamContent(ctx, ps.d.Blobs(), w, &ent); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	return nil
}

// LsEntry is one name in a checkpoint's directory.
type LsEntry struct {
	Name string `json:"name"`
	// NameB64 is the name's raw bytes, base64, when it is not valid UTF-8
	// (Name then holds U+FFFD where the bad bytes were).
	NameB64 string `json:"name_b64,omitempty"`
	// Type is file, dir, symlink, hardlink, fifo, socket, chardev or
	// blockdev. A hardlink shows its primary's metadata; Target names it.
	Type      string    `json:"type"`
	Mode      string    `json:"mode"` // as ls -l prints it: "-rw-r--r--"
	Perm      string    `json:"perm"` // the permission bits in octal: "0644"
	UID       uint32    `json:"uid"`
	GID       uint32    `json:"gid"`
	Size      uint64    `json:"size"`
	Mtime     time.Time `json:"mtime"`
	Xattrs    []string  `json:"xattrs,omitempty"` // names only
	Target    string    `json:"target,omitempty"` // symlink text, or a hardlink's primary ("/path")
	TargetB64 string    `json:"target_b64,omitempty"`
	Rdev      uint64    `json:"rdev,omitempty"`
}

// Ls lists the directory at path ("" or "/": the root) in checkpoint ref,
// sorted by name; a path that is not a directory lists that one entry.
func (ps *Ops) Ls(ctx context.Context, ref catalog.CheckpointRef, path string) ([]LsEntry, error) {
	defer ps.d.Shared()()
	cp, l, err := ps.stateOf(ctx, "", ref)
	if err != nil {
		return nil, err
	}
	rel, err := pathrestore.CleanPath(path)
	if err != nil {
		return nil, err
	}
	where := fmt.Sprintf("checkpoint %s: /%s", cp.ID.Short(), rel)
	ent, sub, ok, err := delta.LookupDir(ctx, ps.d.Blobs(), l, rel)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if !ok {
		return nil, fmt.Errorf("%s: no such file or directory: %w", where, errdefs.ErrNotFound)
	}
	entries := []delta.Entry{ent}
	if ent.Type == delta.TypeDir {
		if entries, _, err = delta.ListDir(ctx, ps.d.Blobs(), sub); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
	}
	out := make([]LsEntry, 0, len(entries))
	for _, x := range entries {
		shown := x
		if x.Type == delta.TypeHardlink {
			p, ok, err := delta.Lookup(ctx, ps.d.Blobs(), l, x.Target)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			if ok {
				shown = p
			}
		}
		le := LsEntry{Name: x.Name, NameB64: b64(x.Name), Type: x.Type.String(), Mode: modeString(x.Type, shown.Mode),
			Perm: fmt.Sprintf("%04o", shown.Mode), UID: shown.UID, GID: shown.GID, Size: shown.Size,
			Mtime: time.Unix(0, shown.MtimeNs).UTC(), Target: x.Target, Rdev: x.Rdev}
		if x.Type == delta.TypeHardlink {
			le.Target = "/" + x.Target
		}
		le.TargetB64 = b64(le.Target)
		for _, xa := range shown.Xattrs {
			le.Xattrs = append(le.Xattrs, xa.Name)
		}
		out = append(out, le)
	}
	return out, nil
}

// modeString prints type and permission bits the way ls -l does.
func modeString(t delta.Type, perm uint32) string {
	m := fs.FileMode(perm & 0o777)
	if perm&unix.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if perm&unix.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if perm&unix.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	switch t {
	case delta.TypeDir:
		m |= fs.ModeDir
	case delta.TypeSymlink:
		m |= fs.ModeSymlink
	case delta.TypeFIFO:
		m |= fs.ModeNamedPipe
	case delta.TypeSocket:
		m |= fs.ModeSocket
	case delta.TypeCharDev:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case delta.TypeBlockDev:
		m |= fs.ModeDevice
	}
	s := []byte(m.String())
	// Go prints the type letters its own way ("dtrwx..."); ls prints one.
	return lsType(t) + string(s[len(s)-9:])
}

func lsType(t delta.Type) string {
	switch t {
	case delta.TypeDir:
		return "d"
	case delta.TypeSymlink:
		return "l"
	case delta.TypeFIFO:
		return "p"
	case delta.TypeSocket:
		return "s"
	case delta.TypeCharDev:
		return "c"
	case delta.TypeBlockDev:
		return "b"
	}
	return "-"
}

// RestorePathsOptions configures RestorePaths.
type RestorePathsOptions struct {
	// To is a host directory to write the paths into (created if missing)
	// instead of the sandbox's live root; the sandbox is then not touched.
	To string
}

// RestorePathsResult reports a path restore.
type RestorePathsResult struct {
	Sandbox    string         `json:"sandbox"`
	Checkpoint delta.ID       `json:"checkpoint"`
	Target     string         `json:"target"` // the live root, or RestorePathsOptions.To
	Paths      []RestoredPath `json:"paths"`
	Duration   time.Duration  `json:"-"`
	DurationMS float64        `json:"duration_ms"`
}

// RestoredPath is what happened to one path.
type RestoredPath struct {
	Path    string `json:"path"` // "/etc/app.conf"
	PathB64 string `json:"path_b64,omitempty"`
	// Action is "restored", "removed" (absent in the checkpoint, so
	// removed from the target) or "absent" (in neither).
	Action string `json:"action"`
	// Entries, Files and Bytes count what was written; Unchanged the
	// entries that already were as in the checkpoint and were left alone.
	Entries   int64 `json:"entries"`
	Files     int64 `json:"files"`
	Bytes     int64 `json:"bytes"`
	Unchanged int64 `json:"unchanged"`
}

// RestorePaths puts paths back into sandbox name's live root as they are
// in checkpoint ref (which may be any sandbox's), with their metadata, and
// leaves everything else alone; a path the checkpoint lacks is removed
// (pathrestore.Restore says exactly how). It holds the sandbox's lock, so no
// checkpoint of it runs meanwhile; its processes keep running and see the
// files change under them. The next checkpoint records the result as an
// ordinary change. With o.To the paths go to that host directory instead.
func (ps *Ops) RestorePaths(ctx context.Context, name delta.SandboxName, ref catalog.CheckpointRef, paths []string, o RestorePathsOptions) (*RestorePathsResult, error) {
	start := time.Now()
	if len(paths) == 0 {
		return nil, fmt.Errorf("restore: no paths given: %w", errdefs.ErrInvalid)
	}
	rels := make([]string, len(paths))
	for i, p := range paths {
		rel, err := pathrestore.CleanPath(p)
		if err != nil {
			return nil, err
		}
		if rel == "" {
			return nil, fmt.Errorf("restore of the whole root %q: use `turnsnap rollback NAME CHECKPOINT --fs-only`: %w", p, errdefs.ErrInvalid)
		}
		rels[i] = rel
	}
	var target string
	if o.To != "" {
		defer ps.d.Shared()()
		if err := ps.d.View(ctx, func(tx *catalog.Tx) error { _, err := tx.Sandbox(delta.SandboxName(name)); return err }); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(o.To, 0o755); err != nil {
			return nil, fmt.Errorf("restore into %s: %w", o.To, err)
		}
		target = o.To
	} else {
		done, err := ps.d.Op(ctx, name)
		if err != nil {
			return nil, err
		}
		defer done()
		if target, err = ps.d.LiveRoot(ctx, string(name)); err != nil {
			return nil, err
		}
	}
	cp, l, err := ps.stateOf(ctx, name, ref)
	if err != nil {
		return nil, err
	}
	fd, err := fsat.OpenDir(target)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	defer unix.Close(fd)
	done, err := pathrestore.Restore(ctx, l, fd, rels, fstree.ApplyOptions{Loader: ps.d.Blobs(), IDs: ps.d.IDs()})
	// Whatever was written is made durable, a failed restore's earlier
	// paths included.
	if serr := unix.Syncfs(fd); serr != nil && err == nil {
		err = serr
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: checkpoint %s: %w", name, cp.ID.Short(), err)
	}
	res := &RestorePathsResult{Sandbox: string(name), Checkpoint: cp.ID, Target: target, Paths: []RestoredPath{}}
	for _, d := range done {
		action := "restored"
		switch {
		case d.Removed && d.Existed:
			action = "removed"
		case d.Removed:
			action = "absent"
		}
		p := "/" + d.Path
		res.Paths = append(res.Paths, RestoredPath{Path: p, PathB64: b64(p), Action: action,
			Entries: d.Stats.Entries, Files: d.Stats.Files, Bytes: d.Stats.Bytes, Unchanged: d.Kept})
	}
	res.Duration = time.Since(start)
	res.DurationMS = float64(res.Duration.Microseconds()) / 1000
	if o.To == "" {
		ps.d.Log.Debug("paths restored", "sandbox", name, "checkpoint", cp.ID.Short(), "paths", len(res.Paths))
	}
	return res, nil
}
