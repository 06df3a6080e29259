package fstree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/turnsnap/turnsnap/delta"
	"math/rand"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"golang.org/x/sys/unix"
)

// memBlobs is a unit-test stand-in for the pack store; engine tests cover the real one.
type memBlobs struct {
	mu sync.Mutex
	m  map[delta.ID][]byte
}

func newMem() *memBlobs { return &memBlobs{m: map[delta.ID][]byte{}} }

func (s *memBlobs) SaveBlob(_ context.Context, _ delta.BlobType, id delta.ID, data []byte) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[id]; ok {
		return false, nil
	}
	s.m[id] = bytes.Clone(data)
	return true, nil
}

func (s *memBlobs) LoadBlob(_ context.Context, _ delta.BlobType, id delta.ID) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.m[id]
	if !ok {
		return nil, fmt.Errorf("blob %s: %w", id.Short(), errdefs.ErrNotFound)
	}
	if delta.Hash(d) != id {
		return nil, fmt.Errorf("blob %s: %w", id.Short(), errdefs.ErrCorrupt)
	}
	return d, nil
}

func requireRoot(t *testing.T) { t.Helper(); testenv.RequireRoot(t) }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// buildRich creates one of every entry kind turnsnap records.
func buildRich(t *testing.T, dir string) {
	t.Helper()
	big := make([]byte, 3<<20)
	rand.New(rand.NewSource(7)).Read(big)
	must(t, os.MkdirAll(filepath.Join(dir, "src/pkg"), 0o755))
	must(t, os.MkdirAll(filepath.Join(dir, "opq"), 0o750))
	must(t, os.WriteFile(filepath.Join(dir, "src/main.go"), []byte("package main\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "src/pkg/big.bin"), big, 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "empty"), nil, 0o640))
	must(t, os.WriteFile(filepath.Join(dir, "setuid"), []byte("x"), 0o755))
	must(t, unix.Chmod(filepath.Join(dir, "setuid"), 0o4755))
	must(t, os.Link(filepath.Join(dir, "src/main.go"), filepath.Join(dir, "zlink")))
	must(t, os.Symlink("../etc/passwd", filepath.Join(dir, "src/escape")))
	must(t, unix.Mkfifo(filepath.Join(dir, "fifo"), 0o644))
	must(t, unix.Mknod(filepath.Join(dir, "gone"), unix.S_IFCHR, 0))
	// overlayfs links whiteouts to one shared inode: several whiteouts, one inode
	must(t, os.Link(filepath.Join(dir, "gone"), filepath.Join(dir, "also-gone")))
	must(t, unix.Setxattr(filepath.Join(dir, "src/main.go"), "user.note", []byte("hello"), 0))
	must(t, unix.Setxattr(filepath.Join(dir, "opq"), OpaqueXattr, []byte("y"), 0))
	must(t, os.Lchown(filepath.Join(dir, "src/pkg"), 1234, 5678))
	must(t, os.Lchown(filepath.Join(dir, "src/escape"), 42, 43))
	old := time.Date(2020, 1, 2, 3, 4, 5, 6789, time.UTC)
	must(t, os.Chtimes(filepath.Join(dir, "src/pkg/big.bin"), old, old))
	must(t, unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(dir, "src/escape"), []unix.Timespec{unix.NsecToTimespec(old.UnixNano()), unix.NsecToTimespec(old.UnixNano())}, unix.AT_SYMLINK_NOFOLLOW))
	must(t, os.Chtimes(filepath.Join(dir, "src"), old, old))
}

// overlayish is the translation the overlay backend applies; duplicated here
// in miniature so delta's tests do not import overlay.
func overlayish(_ string, st *unix.Stat_t, e *delta.Entry) (bool, error) {
	if e.Type == delta.TypeCharDev && e.Rdev == 0 {
		*e = delta.Entry{Name: e.Name, Type: delta.TypeWhiteout}
	}
	kept := e.Xattrs[:0]
	for _, x := range e.Xattrs {
		if x.Name == OpaqueXattr {
			e.Opaque = true
			continue
		}
		kept = append(kept, x)
	}
	e.Xattrs = kept
	if len(e.Xattrs) == 0 {
		e.Xattrs = nil
	}
	return true, nil
}

func TestScanMaterialiseRoundTrip(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	src, dst := t.TempDir(), t.TempDir()
	buildRich(t, src)
	mem := newMem()
	r1, err := Scan(ctx, src, ScanOptions{Saver: mem, Translate: overlayish})
	must(t, err)
	if _, err := Materialise(ctx, r1.Root, dst, ApplyOptions{Loader: mem}); err != nil {
		t.Fatal(err)
	}
	r2, err := Scan(ctx, dst, ScanOptions{Translate: overlayish})
	must(t, err)
	if r1.Root != r2.Root {
		t.Fatalf("tree after materialise %s != original %s", r2.Root.Short(), r1.Root.Short())
	}
	var st unix.Stat_t
	must(t, unix.Lstat(filepath.Join(dst, "zlink"), &st))
	if st.Nlink != 2 {
		t.Errorf("hardlink lost: nlink %d", st.Nlink)
	}
	must(t, unix.Lstat(filepath.Join(dst, "gone"), &st))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout not restored as 0:0 char device")
	}
	buf := make([]byte, 8)
	if n, err := unix.Lgetxattr(filepath.Join(dst, "opq"), OpaqueXattr, buf); err != nil || string(buf[:n]) != "y" {
		t.Errorf("opaque marker lost: %v", err)
	}
	must(t, unix.Lstat(filepath.Join(dst, "setuid"), &st))
	if st.Mode&07777 != 04755 {
		t.Errorf("setuid mode %o", st.Mode&07777)
	}
}

func TestScanCacheSkipsUnchangedFiles(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for i := range 50 {
		must(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%02d", i)), []byte(fmt.Sprint(i)), 0o644))
	}
	time.Sleep(2 * RacyWindow)
	r1, err := Scan(ctx, dir, ScanOptions{Saver: newMem()})
	must(t, err)
	if r1.Stats.FilesRead != 50 {
		t.Fatalf("first scan read %d files, want 50", r1.Stats.FilesRead)
	}
	r2, err := Scan(ctx, dir, ScanOptions{Saver: newMem(), Prev: r1.Cache})
	must(t, err)
	if r2.Stats.FilesRead != 0 || r2.Root != r1.Root {
		t.Fatalf("unchanged rescan read %d files (root equal: %v)", r2.Stats.FilesRead, r2.Root == r1.Root)
	}
	must(t, os.WriteFile(filepath.Join(dir, "f07"), []byte("changed"), 0o644))
	r3, err := Scan(ctx, dir, ScanOptions{Saver: newMem(), Prev: r2.Cache})
	must(t, err)
	if r3.Stats.FilesRead != 1 || r3.Root == r2.Root {
		t.Fatalf("one change: read %d files, root changed %v", r3.Stats.FilesRead, r3.Root != r2.Root)
	}
}

func TestRacyEntriesAreReread(t *testing.T) {
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "f"), []byte("a"), 0o644))
	r1, err := Scan(context.Background(), dir, ScanOptions{})
	must(t, err)
	r2, err := Scan(context.Background(), dir, ScanOptions{Prev: r1.Cache})
	must(t, err)
	if r2.Stats.FilesRead != 1 {
		t.Fatalf("a file written just before its scan was trusted from cache")
	}
}

func TestStateKeyIgnoresTempFileTurn(t *testing.T) {
	dir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(dir, "tmp"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "a"), []byte("a"), 0o644))
	r1, err := Scan(context.Background(), dir, ScanOptions{})
	must(t, err)
	time.Sleep(20 * time.Millisecond)
	must(t, os.WriteFile(filepath.Join(dir, "tmp/scratch"), []byte("x"), 0o644))
	must(t, os.Remove(filepath.Join(dir, "tmp/scratch")))
	r2, err := Scan(context.Background(), dir, ScanOptions{})
	must(t, err)
	if r1.StateKey != r2.StateKey {
		t.Fatal("create+delete of a temp file changed the state key")
	}
	if r1.Root == r2.Root {
		t.Fatal("directory mtime moved but the full tree did not change")
	}
	must(t, os.WriteFile(filepath.Join(dir, "tmp/kept"), nil, 0o644))
	r3, err := Scan(context.Background(), dir, ScanOptions{})
	must(t, err)
	if r3.StateKey == r2.StateKey {
		t.Fatal("a new empty file did not change the state key")
	}
}

func TestMaterialiseRefusesDevicesAndCorruption(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	mem := newMem()
	dev := &delta.Tree{Entries: []delta.Entry{{Name: "sda", Type: delta.TypeBlockDev, Mode: 0o660, Rdev: unix.Mkdev(8, 0)}}}
	data := dev.Encode()
	id := delta.Hash(data)
	mem.SaveBlob(ctx, delta.BlobTree, id, data)
	_, err := Materialise(ctx, id, t.TempDir(), ApplyOptions{Loader: mem})
	if !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("device node: got %v, want ErrPrecondition", err)
	}
	chunk := []byte("content")
	cid := delta.Hash(chunk)
	mem.SaveBlob(ctx, delta.BlobData, cid, chunk)
	ft := &delta.Tree{Entries: []delta.Entry{{Name: "f", Type: delta.TypeFile, Mode: 0o644, Size: 7, Chunks: []delta.ID{cid}}}}
	fdata := ft.Encode()
	fid := delta.Hash(fdata)
	mem.SaveBlob(ctx, delta.BlobTree, fid, fdata)
	mem.m[cid][0] ^= 1
	_, err = Materialise(ctx, fid, t.TempDir(), ApplyOptions{Loader: mem})
	if !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("corrupt chunk: got %v, want ErrCorrupt", err)
	}
}
