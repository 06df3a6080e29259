package history

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/content"
	"github.com/turnsnap/turnsnap/engine/procs"
	"github.com/turnsnap/turnsnap/engine/remote"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"github.com/turnsnap/turnsnap/upload"
)

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, p, data string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, []byte(data), 0o644))
}

// home is Views over real parts: a catalog, a content repository over a
// local store in t.TempDir() and a second local store as the remote.
// Sandbox s has turns s0 <- s1 <- s2 whose files are real trees (scans of
// directories over an empty base); its head went back to s1 (a rollback
// left s2 off the line). Sandbox b was branched from s1 and took b0. The
// live root of s is a plain directory.
type home struct {
	v          *Views
	homeID     string
	cat        *catalog.Catalog
	local      upload.Store
	repo       *content.Repo
	live       string
	s, b       *delta.Sandbox
	s0, s1, s2 *delta.Checkpoint
	b0         *delta.Checkpoint
	intr       *procs.Interrupted
	ops        int
}

func newHome(t *testing.T) *home {
	t.Helper()
	ctx := context.Background()
	local, err := upload.NewLocal(t.TempDir())
	must(t, err)
	bucket, err := upload.NewLocal(t.TempDir())
	must(t, err)
	cat, err := catalog.Open(ctx, t.TempDir(), catalog.Options{})
	must(t, err)
	t.Cleanup(func() { cat.Close() })
	codec, err := delta.NewCodec()
	must(t, err)
	t.Cleanup(codec.Close)
	h := &home{homeID: delta.NewSandboxID(), cat: cat, local: local, repo: content.New(local, cat, codec, nil), live: t.TempDir()}
	scan := func(dir string) delta.ID {
		op := h.repo.Begin()
		res, err := fstree.Scan(ctx, dir, fstree.ScanOptions{Saver: op})
		must(t, err)
		must(t, op.Publish(ctx))
		return res.Root
	}
	base := scan(t.TempDir())
	h.s = &delta.Sandbox{ID: delta.NewSandboxID(), Home: h.homeID, Name: "s", Backend: "overlay", BaseTree: base}
	h.b = &delta.Sandbox{ID: delta.NewSandboxID(), Home: h.homeID, Name: "b", Backend: "overlay", BaseTree: base}
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	take := func(sb *delta.Sandbox, parent delta.ID, turn int, files map[string]string) *delta.Checkpoint {
		dir := t.TempDir()
		for name, data := range files {
			write(t, filepath.Join(dir, name), data)
		}
		at = at.Add(time.Minute)
		cp := &delta.Checkpoint{Version: delta.RecordVersion, Sandbox: sb.Name, SandboxID: sb.ID, Parent: parent, Turn: turn,
			Class: delta.ClassFS, Backend: "overlay", BaseTree: base, FSTree: scan(dir), Created: at,
			Stats: delta.Stats{BytesNew: int64(100 * (turn + 1))}}
		must(t, cat.Update(ctx, func(tx *catalog.Tx) error { return tx.PutCheckpoint(cp) }))
		return cp
	}
	h.s0 = take(h.s, delta.ID{}, 0, map[string]string{"a.txt": "one\n"})
	h.s1 = take(h.s, h.s0.ID, 1, map[string]string{"a.txt": "two\n", "b.txt": "new\n"})
	h.s2 = take(h.s, h.s1.ID, 2, map[string]string{"a.txt": "three\n"})
	h.b.Origin = h.s1.ID
	h.b0 = take(h.b, h.s1.ID, 0, map[string]string{"a.txt": "two\n", "b.txt": "new\n", "c.txt": "branch\n"})
	must(t, cat.Update(ctx, func(tx *catalog.Tx) error {
		for _, r := range []struct {
			sb   *delta.Sandbox
			head delta.ID
		}{{h.s, h.s1.ID}, {h.b, h.b0.ID}} {
			if err := tx.PutSandbox(r.sb); err != nil {
				return err
			}
			if err := tx.SetRef(delta.Ref{Kind: delta.RefHead, Name: string(r.sb.Name), Target: r.head}); err != nil {
				return err
			}
		}
		return nil
	}))
	write(t, filepath.Join(h.live, "a.txt"), "two\n")
	write(t, filepath.Join(h.live, "d.txt"), "live\n")
	rem := remote.New(remote.Deps{Stores: func() (upload.Store, upload.Store) { return local, bucket }})
	var maint sync.RWMutex
	h.v = New(Deps{
		HomeID: func() string { return h.homeID },
		View:   cat.View,
		Update: cat.Update,
		Blobs:  func() delta.BlobLoader { return h.repo },
		PutRef: func(ctx context.Context, kind delta.RefKind, name string, id delta.ID) error {
			return upload.PutBytes(ctx, local, delta.RefName(kind, name), delta.EncodeRef(id))
		},
		DeleteLocal: local.Delete,
		Queue:       rem,
		Shared:      func() func() { maint.RLock(); return maint.RUnlock },
		Op: func(context.Context, delta.SandboxName) (func(), error) {
			maint.RLock()
			h.ops++
			return maint.RUnlock, nil
		},
		Resolve: func(ctx context.Context, name delta.SandboxName, ref catalog.CheckpointRef) (*delta.Checkpoint, error) {
			var cp *delta.Checkpoint
			err := cat.View(ctx, func(tx *catalog.Tx) error {
				id, err := tx.ResolveRef(name, ref)
				if err != nil {
					return err
				}
				cp, err = tx.Checkpoint(id)
				return err
			})
			return cp, err
		},
		ViewSandbox: func(ctx context.Context, name string) (*Sandbox, error) {
			if name != "s" {
				return nil, errdefs.ErrNotFound
			}
			return &Sandbox{Head: h.s1, Root: dirRoot(h.live), Interrupted: h.intr}, nil
		},
		TreeMemo: func(next delta.BlobLoader) TreeStore { return &memo{next: next, m: map[delta.ID][]byte{}} },
	})
	return h
}

// dirRoot is a live root that is a plain directory, scanned whole (its
// base is the empty tree).
type dirRoot string

func (r dirRoot) Path() string                     { return string(r) }
func (dirRoot) Mount(context.Context) error        { return nil }
func (dirRoot) Unmount(context.Context) error      { return nil }
func (dirRoot) Remove(context.Context) error       { return nil }
func (dirRoot) Committed(*fstree.ScanResult) error { return nil }
func (dirRoot) Restore(context.Context, delta.ID, delta.BlobLoader) error {
	return errdefs.ErrInvalid
}
func (r dirRoot) Scan(ctx context.Context, saver delta.BlobSaver) (*fstree.ScanResult, error) {
	return fstree.Scan(ctx, string(r), fstree.ScanOptions{Saver: saver})
}

var _ rootfs.Root = dirRoot("")

// memo keeps what is saved to it in memory, in front of next.
type memo struct {
	mu   sync.Mutex
	next delta.BlobLoader
	m    map[delta.ID][]byte
}

func (m *memo) SaveBlob(_ context.Context, _ delta.BlobType, id delta.ID, data []byte) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.m[id] = slices.Clone(data)
	return true, nil
}

func (m *memo) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	m.mu.Lock()
	d, ok := m.m[id]
	m.mu.Unlock()
	if ok {
		return d, nil
	}
	return m.next.LoadBlob(ctx, t, id)
}

// The log is the head's line newest first, across the branch point for a
// branch, plus the sandbox's own checkpoints a rollback left off it; each
// entry names the other sandboxes that continue from it.
func TestLog(t *testing.T) {
	ctx := context.Background()
	h := newHome(t)
	type row struct {
		id           delta.ID
		head, onHead bool
		branches     string
	}
	rows := func(name string) []row {
		t.Helper()
		log, err := h.v.Log(ctx, delta.SandboxName(name))
		must(t, err)
		var out []row
		for _, l := range log {
			out = append(out, row{l.ID, l.Head, l.OnHead, filepath.Join(l.Branches...)})
		}
		return out
	}
	if got, want := rows("s"), []row{{h.s2.ID, false, false, ""}, {h.s1.ID, true, true, "b"}, {h.s0.ID, false, true, ""}}; !slices.Equal(got, want) {
		t.Errorf("log of s:\n got %v\nwant %v", got, want)
	}
	if got, want := rows("b"), []row{{h.b0.ID, true, true, ""}, {h.s1.ID, false, true, "b"}, {h.s0.ID, false, true, ""}}; !slices.Equal(got, want) {
		t.Errorf("log of b:\n got %v\nwant %v", got, want)
	}
	if _, err := h.v.Log(ctx, "nobody"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("log of a missing sandbox: %v", err)
	}
}

// The lineage holds every checkpoint, children before their parents, with
// heads and branch points.
func TestLineage(t *testing.T) {
	ctx := context.Background()
	h := newHome(t)
	l, err := h.v.Lineage(ctx, LineageOptions{})
	must(t, err)
	var order []delta.ID
	for _, e := range l.Checkpoints {
		order = append(order, e.ID)
	}
	if want := []delta.ID{h.b0.ID, h.s2.ID, h.s1.ID, h.s0.ID}; !slices.Equal(order, want) {
		t.Fatalf("order %v, want %v", order, want)
	}
	s1 := l.Checkpoints[2]
	if s1.Sandbox != "s" || !slices.Equal(s1.Heads, []string{"s"}) || !slices.Equal(s1.Branches, []string{"b"}) || s1.BytesNew != 200 || s1.Removed {
		t.Errorf("s1: %+v", s1)
	}
	if len(l.Sandboxes) != 2 || l.Sandboxes[0].Name != "b" || l.Sandboxes[0].Origin != h.s1.ID || l.Sandboxes[0].OriginSandbox != "s" ||
		l.Sandboxes[1].Head != h.s1.ID {
		t.Errorf("sandboxes: %+v", l.Sandboxes)
	}
}

// Retention's history pins heads, tags and branch points, and knows whose
// sandboxes this home prunes.
func TestLoadHistory(t *testing.T) {
	ctx := context.Background()
	h := newHome(t)
	_, err := h.v.Tag(ctx, "keep", mustRef(h.s2.ID.String()))
	must(t, err)
	hi, err := h.v.LoadHistory(ctx)
	must(t, err)
	for id, want := range map[delta.ID][]string{
		h.s1.ID: {"head of s", "branched: b"},
		h.b0.ID: {"head of b"},
		h.s2.ID: {"tag keep"},
	} {
		if got := hi.Pin[id]; !slices.Equal(got, want) {
			t.Errorf("pins of %s: %q, want %q", id.Short(), got, want)
		}
	}
	if _, ok := hi.Pin[h.s0.ID]; ok {
		t.Errorf("s0 pinned: %q", hi.Pin[h.s0.ID])
	}
	if !slices.Equal(hi.Tags[h.s2.ID], []string{"keep"}) || !hi.Owned[string(h.s.Key())] || !hi.Known[string(h.b.Key())] ||
		hi.Names[string(h.b.Key())] != "b" || hi.Keys["s"] != string(h.s.Key()) || len(hi.BySandbox[string(h.s.Key())]) != 3 {
		t.Errorf("history: %+v", hi)
	}
	h.homeID = delta.NewSandboxID() // another home's view of the same catalog
	if hi, err = h.v.LoadHistory(ctx); err != nil || hi.Owned[string(h.s.Key())] {
		t.Errorf("another home owns s: %v, %v", hi.Owned, err)
	}
}
