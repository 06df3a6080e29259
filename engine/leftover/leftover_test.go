package leftover

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
)

// dirBackend removes a root as a plain directory: enough to test the
// markers without mounts.
type dirBackend struct{ rootfs.Backend }

type dirRoot struct {
	rootfs.Root
	dir string
}

func (b dirBackend) Open(dir, _ string) rootfs.Root { return dirRoot{dir: dir} }
func (r dirRoot) Remove(context.Context) error      { return os.RemoveAll(r.dir) }

func newRoots(t *testing.T) (*Roots, string) {
	home := t.TempDir()
	return New(Deps{
		IntentsDir: filepath.Join(home, "intents"),
		SandboxDir: func(name string) string { return filepath.Join(home, "sandboxes", name) },
		Backend: func(string, json.RawMessage) (rootfs.Backend, error) {
			return dirBackend{}, nil
		},
		DefaultBackend: "overlay",
		Log:            slog.New(slog.DiscardHandler),
	}), home
}

func TestLeftoverMarkFoundAndRemoved(t *testing.T) {
	ctx := context.Background()
	r, home := newRoots(t)
	unmark, err := r.Creating([]string{"a", "b"}, "overlay", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = unmark // this process "was killed": its marker stays
	for _, n := range []string{"a", "b"} {
		if err := os.MkdirAll(filepath.Join(home, "sandboxes", n), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// The holder is this process: Find treats it as one whose undo failed.
	m := r.Find("a")
	if m == nil {
		t.Fatal("no marker for a")
	}
	if r.Find("c") != nil {
		t.Fatal("a marker for a name it does not hold")
	}
	if err := r.Remove(ctx, "a", m); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(home, "sandboxes", "a")); !os.IsNotExist(err) {
		t.Fatalf("a's root stays: %v", err)
	}
	if r.Find("a") != nil || r.Find("b") == nil {
		t.Fatal("the marker should name b only")
	}
	if err := r.RemoveUnknown(ctx, "b", errdefs.ErrNotFound); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(home, "intents", "*"))
	if len(files) != 0 {
		t.Fatalf("markers left: %v", files)
	}
}

func TestLeftoverUnmarkAndUnknown(t *testing.T) {
	r, _ := newRoots(t)
	unmark, err := r.Creating([]string{"x"}, "overlay", nil)
	if err != nil {
		t.Fatal(err)
	}
	unmark()
	if r.Find("x") != nil {
		t.Fatal("a removed marker is found")
	}
	if err := r.ErrUnknown("x"); !errors.Is(err, errdefs.ErrExists) {
		t.Fatalf("ErrUnknown: %v", err)
	}
	// No root and no marker: the catalog's error stands.
	notFound := errors.Join(errors.New("sandbox x"), errdefs.ErrNotFound)
	if err := r.RemoveUnknown(context.Background(), "x", notFound); err != notFound {
		t.Fatalf("RemoveUnknown without a root: %v", err)
	}
}
