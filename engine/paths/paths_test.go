package paths

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/content"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
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

// home is Ops over real parts: a catalog and a content repository over a
// local store in t.TempDir(), holding sandbox s and two checkpoints of it
// made by scanning directories, "then" and "now". The live root is a
// plain directory; ops counts the sandbox locks taken.
type home struct {
	ops       *Ops
	cat       *catalog.Catalog
	live      string
	then, now *delta.Checkpoint
	mu        sync.Mutex
	locks     int
	held      bool
}

func newHome(t *testing.T) *home {
	t.Helper()
	ctx := context.Background()
	store, err := upload.NewLocal(t.TempDir())
	must(t, err)
	cat, err := catalog.Open(ctx, t.TempDir(), catalog.Options{})
	must(t, err)
	t.Cleanup(func() { cat.Close() })
	codec, err := delta.NewCodec()
	must(t, err)
	t.Cleanup(codec.Close)
	repo := content.New(store, cat, codec, nil)
	scan := func(dir string) delta.ID {
		op := repo.Begin()
		res, err := fstree.Scan(ctx, dir, fstree.ScanOptions{Saver: op})
		must(t, err)
		must(t, op.Publish(ctx))
		return res.Root
	}
	base := t.TempDir()
	write(t, filepath.Join(base, "etc/base.conf"), "from the base\n")
	sbID := delta.NewSandboxID()
	h := &home{cat: cat, live: t.TempDir()}
	var cps []*delta.Checkpoint
	parent := delta.ID{}
	for i, text := range []string{"then\n", "now\n"} {
		up := t.TempDir()
		write(t, filepath.Join(up, "etc/app.conf"), text)
		must(t, os.Link(filepath.Join(up, "etc/app.conf"), filepath.Join(up, "etc/hard")))
		must(t, os.Symlink("etc/app.conf", filepath.Join(up, "link")))
		if i == 0 {
			write(t, filepath.Join(up, "only-then"), "x")
		}
		cp := &delta.Checkpoint{Version: delta.RecordVersion, Sandbox: "s", SandboxID: sbID, Parent: parent, Turn: i,
			Class: delta.ClassFS, Backend: "overlay", BaseTree: scan(base), FSTree: scan(up),
			Created: time.Date(2026, 12, 1, 9, i, 0, 0, time.UTC)}
		must(t, cat.Update(ctx, func(tx *catalog.Tx) error { return tx.PutCheckpoint(cp) }))
		parent = cp.ID
		cps = append(cps, cp)
	}
	h.then, h.now = cps[0], cps[1]
	must(t, cat.Update(ctx, func(tx *catalog.Tx) error {
		if err := tx.PutSandbox(&delta.Sandbox{ID: sbID, Name: "s", Backend: "overlay", BaseTree: h.now.BaseTree}); err != nil {
			return err
		}
		return tx.SetRef(delta.Ref{Kind: delta.RefHead, Name: "s", Target: h.now.ID})
	}))
	write(t, filepath.Join(h.live, "etc/app.conf"), "live\n")
	write(t, filepath.Join(h.live, "stray"), "x")
	var maint sync.RWMutex
	h.ops = New(Deps{
		Log:    slog.New(slog.DiscardHandler),
		View:   cat.View,
		Blobs:  func() delta.BlobLoader { return repo },
		IDs:    func() delta.IDs { return delta.IDs{} },
		Shared: func() func() { maint.RLock(); return maint.RUnlock },
		Op: func(ctx context.Context, name delta.SandboxName) (func(), error) {
			maint.RLock()
			h.mu.Lock()
			h.locks++
			h.held = true
			h.mu.Unlock()
			return func() {
				h.mu.Lock()
				h.held = false
				h.mu.Unlock()
				maint.RUnlock()
			}, nil
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
		LiveRoot: func(ctx context.Context, name string) (string, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			if !h.held {
				t.Errorf("live root of %s loaded without the sandbox's lock", name)
			}
			return h.live, nil
		},
	})
	return h
}

func TestCat(t *testing.T) {
	ctx := context.Background()
	h := newHome(t)
	for _, c := range []struct {
		ref, path, want string
	}{
		{h.then.ID.String(), "/etc/app.conf", "then\n"},
		{"s@HEAD", "etc/app.conf", "now\n"},
		{h.now.ID.String(), "/etc/hard", "now\n"}, // through its primary
		{h.now.ID.String(), "/etc/base.conf", "from the base\n"},
	} {
		var got bytes.Buffer
		if err := h.ops.Cat(ctx, mustRef(c.ref), c.path, &got); err != nil || got.String() != c.want {
			t.Errorf("cat %s %s: %q, %v; want %q", c.ref, c.path, got.String(), err, c.want)
		}
	}
	for _, c := range []struct {
		path  string
		class error
	}{
		{"/etc", errdefs.ErrInvalid},
		{"/", errdefs.ErrInvalid},
		{"/link", errdefs.ErrInvalid},
		{"/no-such", errdefs.ErrNotFound},
		{"/etc/../etc/app.conf", errdefs.ErrInvalid},
	} {
		if err := h.ops.Cat(ctx, mustRef(h.now.ID.String()), c.path, io.Discard); !errors.Is(err, c.class) {
			t.Errorf("cat %s: %v, want %v", c.path, err, c.class)
		}
	}
	if err := h.ops.Cat(ctx, mustRef("nosuchtag"), "/etc/app.conf", io.Discard); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("cat of a missing checkpoint: %v", err)
	}
}

func TestLs(t *testing.T) {
	ctx := context.Background()
	h := newHome(t)
	root, err := h.ops.Ls(ctx, mustRef(h.then.ID.String()), "/")
	must(t, err)
	var names []string
	for _, e := range root {
		names = append(names, e.Name+":"+e.Type)
	}
	if want := []string{"etc:dir", "link:symlink", "only-then:file"}; !slices.Equal(names, want) {
		t.Fatalf("ls /: %v, want %v", names, want)
	}
	if root[0].Mode != "drwxr-xr-x" || root[1].Target != "etc/app.conf" || root[2].Mode != "-rw-r--r--" || root[2].Perm != "0644" {
		t.Errorf("ls /: %+v", root)
	}
	etc, err := h.ops.Ls(ctx, mustRef(h.then.ID.String()), "etc")
	must(t, err)
	if len(etc) != 3 || etc[0].Name != "app.conf" || etc[1].Name != "base.conf" || etc[2].Name != "hard" {
		t.Fatalf("ls /etc: %+v", etc)
	}
	if hard := etc[2]; hard.Type != "hardlink" || hard.Target != "/etc/app.conf" || hard.Size != 5 || hard.Mode != "-rw-r--r--" {
		t.Errorf("a hardlink shows its primary's metadata and names it: %+v", hard)
	}
	one, err := h.ops.Ls(ctx, mustRef(h.then.ID.String()), "/etc/app.conf")
	must(t, err)
	if len(one) != 1 || one[0].Name != "app.conf" || one[0].Size != 5 {
		t.Errorf("ls of a file: %+v", one)
	}
	if _, err := h.ops.Ls(ctx, mustRef(h.then.ID.String()), "/nothing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ls of a missing path: %v", err)
	}
}

func TestModeString(t *testing.T) {
	for _, c := range []struct {
		t    delta.Type
		perm uint32
		want string
	}{
		{delta.TypeFile, 0o755, "-rwxr-xr-x"},
		{delta.TypeDir, 0o700, "drwx------"},
		{delta.TypeSymlink, 0o777, "lrwxrwxrwx"},
		{delta.TypeFIFO, 0o644, "prw-r--r--"},
		{delta.TypeCharDev, 0o666, "crw-rw-rw-"},
		{delta.TypeBlockDev, 0o660, "brw-rw----"},
		{delta.TypeSocket, 0o755, "srwxr-xr-x"},
	} {
		if got := modeString(c.t, c.perm); got != c.want {
			t.Errorf("modeString(%s, %o) = %q, want %q", c.t, c.perm, got, c.want)
		}
	}
}

// Into the live root, RestorePaths holds the sandbox's lock (Op) while it
// loads the root and writes; a path the checkpoint lacks is removed, or
// reported absent; everything else is left alone.
func TestRestorePathsIntoTheLiveRoot(t *testing.T) {
	ctx := context.Background()
	h := newHome(t)
	r, err := h.ops.RestorePaths(ctx, "s", mustRef(h.then.ID.String()), []string{"/etc/app.conf", "stray", "/nothing"}, RestorePathsOptions{})
	must(t, err)
	if h.locks != 1 || h.held {
		t.Fatalf("sandbox lock taken %d times, held after: %v", h.locks, h.held)
	}
	if r.Sandbox != "s" || r.Checkpoint != h.then.ID || r.Target != h.live {
		t.Errorf("result: %+v", r)
	}
	var actions []string
	for _, p := range r.Paths {
		actions = append(actions, p.Path+" "+p.Action)
	}
	if want := []string{"/etc/app.conf restored", "/nothing absent", "/stray removed"}; !slices.Equal(actions, want) {
		t.Errorf("actions %v, want %v", actions, want)
	}
	if b, _ := os.ReadFile(filepath.Join(h.live, "etc/app.conf")); string(b) != "then\n" {
		t.Errorf("restored file: %q", b)
	}
	if _, err := os.Lstat(filepath.Join(h.live, "stray")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a path the checkpoint lacks stays: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(h.live, "link")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a path not asked for was written: %v", err)
	}
}

// With To, the paths go to a host directory: the sandbox must exist, but
// its lock is not taken and its root not touched.
func TestRestorePathsToADirectory(t *testing.T) {
	ctx := context.Background()
	h := newHome(t)
	to := filepath.Join(t.TempDir(), "out")
	r, err := h.ops.RestorePaths(ctx, "s", mustRef(h.then.ID.String()), []string{"/etc"}, RestorePathsOptions{To: to})
	must(t, err)
	if h.locks != 0 || r.Target != to || len(r.Paths) != 1 || r.Paths[0].Files != 2 {
		t.Fatalf("locks %d, result %+v", h.locks, r)
	}
	for name, want := range map[string]string{"etc/app.conf": "then\n", "etc/base.conf": "from the base\n", "etc/hard": "then\n"} {
		if b, _ := os.ReadFile(filepath.Join(to, name)); string(b) != want {
			t.Errorf("%s: %q, want %q", name, b, want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(h.live, "etc/app.conf")); string(b) != "live\n" {
		t.Errorf("the live root changed: %q", b)
	}
	if _, err := h.ops.RestorePaths(ctx, "nobody", mustRef(h.then.ID.String()), []string{"/etc"}, RestorePathsOptions{To: to}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("restore for a missing sandbox: %v", err)
	}
}

func TestRestorePathsRefuses(t *testing.T) {
	ctx := context.Background()
	h := newHome(t)
	for _, p := range [][]string{nil, {"/"}, {"a/../b"}} {
		if _, err := h.ops.RestorePaths(ctx, "s", mustRef(h.then.ID.String()), p, RestorePathsOptions{}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("restore of %q: %v", p, err)
		}
	}
	if h.locks != 0 {
		t.Errorf("a refused restore took the sandbox's lock")
	}
}
