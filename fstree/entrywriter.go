package fstree

import (
	"context"
	"math"

	"github.com/turnsnap/turnsnap/delta"
)

// EntryWriter writes entries one at a time below a root directory, each
// exactly as Materialise writes it (chunks verified as they are read,
// metadata, device nodes only as CheckDevice allows unless AllowDevices),
// for restores that choose their own entries (fstree/pathrestore). Names
// are reached from the root with openat2 RESOLVE_BENEATH, never through a
// symlink.
type EntryWriter struct{ a applier }

// NewEntryWriter writes below the directory rootFD with opts (Loader, IDs,
// AllowDevices, Placeholder). It writes no overlay marker and bounds
// nothing: the caller checks each entry (delta.CheckEntry).
func NewEntryWriter(rootFD int, opts ApplyOptions) *EntryWriter {
	return &EntryWriter{a: applier{opts: opts, rootFD: rootFD, files: map[string]bool{},
		budget: delta.Footprint{Entries: math.MaxUint64}}}
}

// Write creates e, named e.Name in the directory dirFD, whose path below
// the root is rel: a file with its content, a symlink, a node, or a
// directory with its whole subtree. A hardlink must name a file Wrote
// knows.
func (w *EntryWriter) Write(ctx context.Context, dirFD int, rel string, e *delta.Entry) error {
	return w.a.entry(ctx, dirFD, rel, e)
}

// NoteFile records rel as a regular file in place below the root that
// hardlinks may name, though this writer did not write it.
func (w *EntryWriter) NoteFile(rel string) { w.a.files[rel] = true }

// Wrote says whether rel is a regular file Write wrote or NoteFile noted.
func (w *EntryWriter) Wrote(rel string) bool { return w.a.files[rel] }

// Stats is what was written so far; a caller counts in it what it makes
// itself, and may reset it between its own units of work.
func (w *EntryWriter) Stats() *ApplyStats { return &w.a.stats }

// SetFileMeta gives the open file or directory fd entry e's ownership,
// mode, xattrs and mtime, exactly as a restore does (xattrs e does not
// list are removed, except overlay's trusted.overlay.*). Lazy restore
// calls it after filling a placeholder: writing a file drops its file
// capabilities and moves its mtime, and the fill's marker xattr must go.
func SetFileMeta(fd int, e *delta.Entry) error {
	return setMeta(metaTarget{fd: fd}, e)
}

// RemoveAt removes name in the directory dirFD and everything below it,
// never following a symlink; a name already gone is no error.
func RemoveAt(dirFD int, name string) error { return removeAt(dirFD, name) }
