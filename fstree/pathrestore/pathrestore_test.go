package pathrestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"golang.org/x/sys/unix"
)

func TestCleanPath(t *testing.T) {
	for in, want := range map[string]string{
		"/etc/app.conf": "etc/app.conf", "etc//app.conf/": "etc/app.conf", "/": "", "": "", "a": "a",
	} {
		if got, err := CleanPath(in); err != nil || got != want {
			t.Errorf("CleanPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"..", "/../etc", "a/../../b", "./a", "a/.", "a\x00b", strings.Repeat("n", 256)} {
		if got, err := CleanPath(bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("CleanPath(%q) = %q, %v; want ErrInvalid", bad, got, err)
		}
	}
}

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"/a/b", "../x", "a//b/", "\x00", "./."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		rel, err := CleanPath(p)
		if err != nil {
			return
		}
		if rel != "" && !delta.ValidPath(rel) {
			t.Fatalf("CleanPath(%q) = %q, not a valid path", p, rel)
		}
		for _, c := range strings.Split(rel, "/") {
			if c == ".." || c == "." {
				t.Fatalf("CleanPath(%q) = %q keeps %q", p, rel, c)
			}
		}
	})
}

// RestorePaths refuses device nodes outside the device rule, leaves a
// path as it was when a chunk is damaged, and copies a hardlink whose
// primary it does not restore.
func TestRestoreRules(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	mem := roottest.NewMemStore()
	put := func(tr *delta.Tree) delta.ID {
		data := tr.Encode()
		id := delta.Hash(data)
		mem.SaveBlob(ctx, delta.BlobTree, id, data)
		return id
	}
	chunk := func(s string) delta.ID {
		id := delta.Hash([]byte(s))
		mem.SaveBlob(ctx, delta.BlobData, id, []byte(s))
		return id
	}
	good, bad := chunk("good\n"), chunk("bad!\n")
	mem.Corrupt(bad)
	sub := put(&delta.Tree{Entries: []delta.Entry{{Name: "f", Type: delta.TypeFile, Mode: 0o600, MtimeNs: 1e18, Size: 5, Chunks: []delta.ID{good}}}})
	root := put(&delta.Tree{Entries: []delta.Entry{
		{Name: "broken", Type: delta.TypeFile, Mode: 0o644, Size: 5, Chunks: []delta.ID{bad}},
		{Name: "d", Type: delta.TypeDir, Mode: 0o755, Subtree: sub},
		{Name: "link", Type: delta.TypeHardlink, Target: "d/f"},
		{Name: "sda", Type: delta.TypeBlockDev, Mode: 0o660, Rdev: unix.Mkdev(8, 0)},
	}})
	dst := t.TempDir()
	os.WriteFile(filepath.Join(dst, "broken"), []byte("old\n"), 0o644)
	fd, err := fsat.OpenDir(dst)
	must(t, err)
	defer unix.Close(fd)
	l := delta.Layers{root}
	_, err = Restore(ctx, l, fd, []string{"sda"}, fstree.ApplyOptions{Loader: mem})
	if !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("block device: %v, want ErrPrecondition", err)
	}
	_, err = Restore(ctx, l, fd, []string{"broken"}, fstree.ApplyOptions{Loader: mem})
	if !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("damaged chunk: %v, want ErrCorrupt", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "broken")); string(b) != "old\n" {
		t.Fatalf("a failed restore changed the path: %q", b)
	}
	res, err := Restore(ctx, l, fd, []string{"link"}, fstree.ApplyOptions{Loader: mem})
	must(t, err)
	var st unix.Stat_t
	must(t, unix.Lstat(filepath.Join(dst, "link"), &st))
	if b, _ := os.ReadFile(filepath.Join(dst, "link")); string(b) != "good\n" || st.Mode&07777 != 0o600 || st.Nlink != 1 || res[0].Stats.Files != 1 {
		t.Fatalf("hardlink outside the set: %q mode %o nlink %d %+v", b, st.Mode&07777, st.Nlink, res)
	}
	names, _ := os.ReadDir(dst)
	if len(names) != 2 {
		t.Fatalf("left behind: %v", names)
	}
}

// TestStreamContentLoadsChunkList: given an indirect entry whose chunk list
// was never loaded, StreamContent loads the list, then the chunks (here
// never stored: the first one is not found).
func TestStreamContentLoadsChunkList(t *testing.T) {
	ctx := context.Background()
	mem := roottest.NewMemStore()
	chunks := make([]delta.ID, 40)
	for i := range chunks {
		chunks[i] = delta.Hash(fmt.Appendf(nil, "chunk %d", i))
	}
	tr := &delta.Tree{Entries: []delta.Entry{{Name: "big", Type: delta.TypeFile, Mode: 0o644, Size: 40 * delta.ChunkAverage, Chunks: chunks}}}
	_, data, err := delta.SaveTree(ctx, delta.IDs{}, tr, func(ctx context.Context, id delta.ID, data []byte) error {
		_, err := mem.SaveBlob(ctx, delta.BlobTree, id, data)
		return err
	})
	must(t, err)
	shallow, err := delta.DecodeTree(data)
	must(t, err)
	e := shallow.Find("big")
	if !e.Indirect() || e.Resolved() {
		t.Fatal("the saved tree's big file names no chunk list")
	}
	var buf bytes.Buffer
	if _, err := StreamContent(ctx, mem, &buf, e); err == nil || !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stream of an entry without stored chunks: %v (want the first chunk not found)", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
