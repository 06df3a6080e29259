// Package audit is the audit view of a sandbox's history: its head lineage
// turn by turn, what each turn changed and cost, and what a weaker recovery
// would have lost had the sandbox crashed right after it; as JSON (Report)
// or one self-contained HTML page (WriteHTML).
package audit

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/delta"
)

// MaxFiles bounds the files listed for one turn; the counts are
// always complete.
const MaxFiles = 500

// Report is a sandbox's head lineage, one entry per checkpoint, oldest
// first: what each turn changed, what it cost, and what a weaker recovery
// would have lost had the sandbox crashed right after it.
type Report struct {
	Sandbox string         `json:"sandbox"`
	Turns   []Turn         `json:"turns"`
	Totals  Totals         `json:"totals"`
	Classes map[string]int `json:"classes"`
}

// Totals sums the turns.
type Totals struct {
	Turns      int     `json:"turns"`
	BytesNew   int64   `json:"bytes_new"`
	DurationMS float64 `json:"duration_ms"`
}

// Turn is one checkpoint.
type Turn struct {
	Turn       int         `json:"turn"`
	Checkpoint delta.ID    `json:"checkpoint"`
	Parent     delta.ID    `json:"parent"`
	Class      delta.Class `json:"class"`
	Message    string      `json:"message,omitempty"`
	Created    time.Time   `json:"created"`
	BytesNew   int64       `json:"bytes_new"`
	DurationMS float64     `json:"duration_ms"`
	PauseMS    float64     `json:"pause_ms"`
	Added      int         `json:"added"`
	Modified   int         `json:"modified"`
	Deleted    int         `json:"deleted"`
	// Files lists the changes since the parent (at most MaxFiles).
	Files     []File  `json:"files"`
	Truncated bool    `json:"files_truncated,omitempty"`
	Processes Process `json:"processes"`
	// ChatOnlyLoses is everything since the base; ChatFSLoses the
	// processes' state.
	ChatOnlyLoses Loss `json:"chat_only_loses"`
	ChatFSLoses   Loss `json:"chat_fs_loses"`
}

// File is one changed path.
type File struct {
	Path     string `json:"path"`
	Change   string `json:"change"` // added, modified, deleted
	Type     string `json:"type"`
	Size     uint64 `json:"size"`
	PrevSize uint64 `json:"prev_size,omitempty"`
	// Meta lists metadata changes of a modified path (mode, owner,
	// mtime, xattrs, link target); Content says its bytes changed.
	Meta    []string `json:"meta,omitempty"`
	Content bool     `json:"content,omitempty"`
}

// Process is the turn's process state, from the records: the image
// the checkpoint carries and how it relates to its parent's.
type Process struct {
	Image      bool   `json:"image"`
	State      string `json:"state"` // none, started, changed, unchanged, ended
	ImageBytes uint64 `json:"image_bytes"`
	ImageFiles int    `json:"image_files"`
	// Why is the record's reason the processes counted as changed (a
	// process appeared, exited, did I/O, its files changed). Empty when they
	// did not, and for records written before version 4 kept it.
	Why string `json:"why,omitempty"`
}

// Loss is what a recovery method would not bring back.
type Loss struct {
	Paths     int    `json:"paths"`
	Bytes     uint64 `json:"bytes"`
	Processes bool   `json:"processes"`
	Summary   string `json:"summary"`
}

// Build reports chain, a sandbox's head lineage oldest first, turn by
// turn, reading its trees through loader.
func Build(ctx context.Context, sandbox string, chain []*delta.Checkpoint, loader delta.BlobLoader) (*Report, error) {
	rep := &Report{Sandbox: sandbox, Turns: []Turn{}, Classes: map[string]int{}}
	var parent *delta.Checkpoint
	for _, cp := range chain {
		t, err := turn(ctx, loader, parent, cp)
		if err != nil {
			return nil, fmt.Errorf("audit of sandbox %s: checkpoint %s: %w", sandbox, cp.ID.Short(), err)
		}
		rep.Turns = append(rep.Turns, *t)
		rep.Classes[string(cp.Class)]++
		rep.Totals.Turns++
		rep.Totals.BytesNew += t.BytesNew
		rep.Totals.DurationMS += t.DurationMS
		parent = cp
	}
	return rep, nil
}

func layersOf(cp *delta.Checkpoint) delta.Layers { return delta.Layers{cp.BaseTree, cp.FSTree} }

func turn(ctx context.Context, loader delta.BlobLoader, parent, cp *delta.Checkpoint) (*Turn, error) {
	t := &Turn{Turn: cp.Turn, Checkpoint: cp.ID, Parent: cp.Parent, Class: cp.Class, Message: cp.Message,
		Created: cp.Created, BytesNew: cp.Stats.BytesNew, DurationMS: float64(cp.Stats.DurationNs) / 1e6,
		PauseMS: float64(cp.Stats.PauseNs) / 1e6, Files: []File{}}
	from := delta.Layers{cp.BaseTree}
	if parent != nil {
		from = layersOf(parent)
	}
	changes, err := delta.Diff(ctx, loader, from, layersOf(cp))
	if err != nil {
		return nil, err
	}
	for _, c := range changes {
		switch c.Kind {
		case delta.Added:
			t.Added++
		case delta.Modified:
			t.Modified++
		case delta.Deleted:
			t.Deleted++
		}
		if len(t.Files) >= MaxFiles {
			t.Truncated = true
			continue
		}
		f := File{Path: "/" + c.Path, Change: c.Kind.String(), Type: c.Type.String()}
		now, err := lookupEntry(ctx, loader, layersOf(cp), c.Path)
		if err != nil {
			return nil, err
		}
		was, err := lookupEntry(ctx, loader, from, c.Path)
		if err != nil {
			return nil, err
		}
		if now != nil {
			f.Size = now.Size
		}
		if was != nil && c.Kind != delta.Added {
			f.PrevSize = was.Size
			if c.Kind == delta.Deleted {
				f.Size = was.Size
			}
		}
		if c.Kind == delta.Modified && now != nil && was != nil {
			f.Meta, f.Content = metaChanges(was, now)
		}
		t.Files = append(t.Files, f)
	}
	if t.Processes, err = procs(ctx, loader, parent, cp); err != nil {
		return nil, err
	}
	// What chat-only recovery (restart from the base) loses: every path
	// that differs from the base, and the processes.
	sinceBase, err := delta.Diff(ctx, loader, delta.Layers{cp.BaseTree}, layersOf(cp))
	if err != nil {
		return nil, err
	}
	lost := Loss{Processes: t.Processes.Image}
	for _, c := range sinceBase {
		lost.Paths++
		if c.Kind != delta.Deleted && c.Type == delta.TypeFile {
			if en, err := lookupEntry(ctx, loader, layersOf(cp), c.Path); err == nil && en != nil {
				lost.Bytes += en.Size
			}
		}
	}
	lost.Summary = fmt.Sprintf("%d paths changed since the base (%d bytes of files)", lost.Paths, lost.Bytes)
	if lost.Processes {
		lost.Summary += " and the running processes"
	}
	t.ChatOnlyLoses = lost
	t.ChatFSLoses = Loss{Processes: t.Processes.Image, Summary: "nothing: no process was running"}
	if t.Processes.Image {
		t.ChatFSLoses.Summary = fmt.Sprintf("the running processes and their memory (a %d-byte image)", t.Processes.ImageBytes)
	}
	return t, nil
}

// procs compares the checkpoint's process image with its parent's.
func procs(ctx context.Context, loader delta.BlobLoader, parent, cp *delta.Checkpoint) (Process, error) {
	p := Process{Why: cp.ProcChange}
	var prev *delta.ID
	if parent != nil {
		prev = parent.ProcTree
	}
	switch {
	case cp.ProcTree == nil && prev == nil:
		p.State = "none"
	case cp.ProcTree == nil:
		p.State = "ended"
	case prev == nil:
		p.State = "started"
	case *prev == *cp.ProcTree:
		p.State = "unchanged"
	default:
		p.State = "changed"
	}
	if cp.ProcTree == nil {
		return p, nil
	}
	p.Image = true
	var walk func(id delta.ID, depth int) error
	walk = func(id delta.ID, depth int) error {
		if id.IsZero() || depth > 64 {
			return nil
		}
		tr, err := delta.LoadTree(ctx, loader, id)
		if err != nil {
			return err
		}
		for _, en := range tr.Entries {
			switch en.Type {
			case delta.TypeDir:
				if err := walk(en.Subtree, depth+1); err != nil {
					return err
				}
			case delta.TypeFile:
				p.ImageBytes += en.Size
				p.ImageFiles++
			}
		}
		return nil
	}
	return p, walk(*cp.ProcTree, 0)
}

// lookupEntry finds path p in the merged layers (overlay rules: a
// whiteout or a non-directory hides what is below, an opaque directory
// hides the lower directory's entries). nil: not there.
func lookupEntry(ctx context.Context, loader delta.BlobLoader, layers delta.Layers, p string) (*delta.Entry, error) {
	var cur []delta.ID // the directory's trees at this depth, top first
	for i := len(layers) - 1; i >= 0; i-- {
		if !layers[i].IsZero() {
			cur = append(cur, layers[i])
		}
	}
	parts := strings.Split(p, "/")
	for i, name := range parts {
		var next []delta.ID
	layers:
		for _, id := range cur {
			tr, err := delta.LoadTree(ctx, loader, id)
			if err != nil {
				return nil, err
			}
			en := tr.Find(name)
			switch {
			case en == nil:
				continue
			case en.Type == delta.TypeWhiteout:
				break layers
			case i == len(parts)-1:
				if len(next) > 0 { // a directory above: that is the entry
					break layers
				}
				c := *en
				return &c, nil
			case en.Type != delta.TypeDir:
				break layers
			}
			if !en.Subtree.IsZero() {
				next = append(next, en.Subtree)
			}
			if en.Opaque {
				break
			}
		}
		if i == len(parts)-1 && len(next) > 0 {
			return &delta.Entry{Name: name, Type: delta.TypeDir}, nil
		}
		if len(next) == 0 {
			return nil, nil
		}
		cur = next
	}
	return nil, nil
}

// metaChanges says what differs between two entries of one path, as
// the audit words it (engine/diffview has the diff's structured form).
func metaChanges(was, now *delta.Entry) ([]string, bool) {
	var m []string
	if was.Mode != now.Mode {
		m = append(m, fmt.Sprintf("mode %04o -> %04o", was.Mode, now.Mode))
	}
	if was.UID != now.UID || was.GID != now.GID {
		m = append(m, fmt.Sprintf("owner %d:%d -> %d:%d", was.UID, was.GID, now.UID, now.GID))
	}
	if was.MtimeNs != now.MtimeNs {
		m = append(m, "mtime")
	}
	if was.Target != now.Target {
		m = append(m, fmt.Sprintf("target %q -> %q", was.Target, now.Target))
	}
	if !slices.EqualFunc(was.Xattrs, now.Xattrs, func(a, b delta.Xattr) bool { return a.Name == b.Name && string(a.Value) == string(b.Value) }) {
		m = append(m, "xattrs")
	}
	return m, was.Size != now.Size || !delta.SameChunks(was, now)
}
