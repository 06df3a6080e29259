package engine

import (
	"context"
	"fmt"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/proc/criu"
)

// Device nodes made inside a sandbox follow one rule, delta.CheckDevice,
// at every step: a checkpoint refuses a root holding a device it would not
// restore (deviceGuard), verify, rollback and branch apply it to the whole
// layer through delta.CheckState before they stop anything, and the
// restore itself applies the same rule.

// deviceGuard passes a scan's blobs on to the repository and refuses every
// new tree holding a device node CheckDevice refuses, so the checkpoint
// fails before anything is committed.
type deviceGuard struct{ delta.BlobSaver }

func (g deviceGuard) SaveBlob(ctx context.Context, t delta.BlobType, id delta.ID, plain []byte) (bool, error) {
	if t == delta.BlobTree && !delta.IsChunkList(plain) { // a chunk list names chunks only
		tree, err := delta.DecodeTree(plain)
		if err != nil {
			return false, fmt.Errorf("tree %s: %w", id.Short(), err)
		}
		for _, en := range tree.Entries {
			if err := delta.CheckDevice(en); err != nil {
				return false, err
			}
		}
	}
	return g.BlobSaver.SaveBlob(ctx, t, id, plain)
}

// PrepareBlob forwards the ingest pipeline's compression ahead of time
// (fstree.BlobPreparer); only trees are checked, in SaveBlob.
func (g deviceGuard) PrepareBlob(ctx context.Context, t delta.BlobType, id delta.ID, plain []byte) {
	fstree.Prepare(ctx, g.BlobSaver, t, id, plain)
}

// checkImageFiles refuses a process image whose processes expect files the
// checkpoint's files do not have (a size CRIU would reject): an image
// carried forward past a change of a file its processes use, by a turnsnap
// that did not yet dump on such changes. Rollback and branch call it before
// they stop anything.
func checkImageFiles(ctx context.Context, loader delta.BlobLoader, cp *delta.Checkpoint, img string) error {
	files, err := criu.ImageFiles(img)
	if err != nil {
		return fmt.Errorf("checkpoint %s: process image: %w", cp.ID.Short(), err)
	}
	for _, f := range files {
		e, ok, err := delta.Lookup(ctx, loader, delta.Layers{cp.BaseTree, cp.FSTree}, f.Path)
		if err != nil {
			return fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
		}
		have := "no such file"
		switch {
		case ok && e.Type == delta.TypeFile && int64(e.Size) == f.Size:
			continue
		case ok && e.Type == delta.TypeFile:
			have = fmt.Sprintf("%d bytes", e.Size)
		case ok:
			have = "not a regular file"
		}
		return fmt.Errorf("checkpoint %s: its processes expect %s to be a file of %d bytes, its files have %s (the image does not fit the files; restore the files only with --fs-only): %w",
			cp.ID.Short(), f.Path, f.Size, have, errdefs.ErrPrecondition)
	}
	return nil
}
