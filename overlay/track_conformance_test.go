package overlay

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/overlay/track"
)

// TestConformanceTracked runs the whole root conformance suite with every
// scan going through a change tracker (ScanTracked), as the daemon's are:
// renames, long paths, racing writers, restores and random edits must all
// give what the walk gives.
func TestConformanceTracked(t *testing.T) {
	roottest.Run(t, func(t *testing.T) roottest.Setup {
		testenv.RequireRoot(t)
		b := &trackedBackend{Backend: NewBackend(filepath.Join(t.TempDir(), "bases")), t: t}
		t.Cleanup(func() { t.Logf("%d tracked scans, walks %v", b.tracked, b.walked) })
		return roottest.Setup{Backend: b}
	})
}

// trackedBackend makes roots whose Scan is ScanTracked.
type trackedBackend struct {
	*Backend
	t     *testing.T
	roots map[string]*trackedRoot // by sandbox dir: one tracker per root, as the engine keeps one per sandbox
	// tracked and walked count the scans of every root, by how they went.
	tracked int
	walked  map[string]int
}

func (b *trackedBackend) Create(ctx context.Context, dir, base string, tree delta.ID, loader delta.BlobLoader) (rootfs.Root, error) {
	r, err := Create(ctx, dir, base, tree, loader)
	if err != nil {
		return nil, err
	}
	return b.wrap(r), nil
}

func (b *trackedBackend) Open(dir, base string) rootfs.Root { return b.wrap(Open(dir, base)) }

func (b *trackedBackend) wrap(r *Root) *trackedRoot {
	if b.roots == nil {
		b.roots = map[string]*trackedRoot{}
	}
	if tr := b.roots[r.dir]; tr != nil {
		tr.Root = r
		return tr
	}
	tr := &trackedRoot{Root: r, b: b}
	b.roots[r.dir] = tr
	b.t.Cleanup(tr.stop)
	return tr
}

// trackedRoot drives its tracker the way the engine does: started before
// the first scan, reset by Committed with the last scan, dropped before
// anything unmounts the root.
type trackedRoot struct {
	*Root
	b    *trackedBackend
	tr   *track.Tracker
	last *fstree.ScanResult
}

func (r *trackedRoot) stop() {
	if r.tr != nil {
		r.tr.Close()
		r.tr = nil
	}
}

func (r *trackedRoot) Scan(ctx context.Context, saver delta.BlobSaver) (*fstree.ScanResult, error) {
	if r.tr == nil || !r.tr.Watches(r.Root.Path()) {
		r.stop()
		tr, err := r.Root.Track(track.Options{})
		if err != nil {
			return nil, err
		}
		r.tr = tr
	}
	res, info, err := r.Root.ScanTracked(ctx, saver, r.tr)
	if err != nil {
		r.tr.Lost()
		return nil, err
	}
	if info.Walked {
		if r.b.walked == nil {
			r.b.walked = map[string]int{}
		}
		r.b.walked[info.Reason]++
	} else {
		r.b.tracked++
	}
	r.last = res
	return res, nil
}

func (r *trackedRoot) Committed(res *fstree.ScanResult) error {
	if err := r.Root.Committed(res); err != nil {
		return err
	}
	if r.tr != nil {
		if res == r.last {
			r.tr.Reset(res)
		} else {
			r.tr.Lost() // not the scan the record was taken for
		}
	}
	return nil
}

func (r *trackedRoot) Unmount(ctx context.Context) error {
	r.stop()
	return r.Root.Unmount(ctx)
}

func (r *trackedRoot) Remove(ctx context.Context) error {
	r.stop()
	return r.Root.Remove(ctx)
}

func (r *trackedRoot) Restore(ctx context.Context, tree delta.ID, loader delta.BlobLoader) error {
	r.stop()
	return r.Root.Restore(ctx, tree, loader)
}
