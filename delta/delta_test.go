package delta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
	m  map[ID][]byte
}

func newMem() *memBlobs { return &memBlobs{m: map[ID][]byte{}} }

func (s *memBlobs) SaveBlob(_ context.Context, _ BlobType, id ID, data []byte) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[id]; ok {
		return false, nil
	}
	s.m[id] = bytes.Clone(data)
	return true, nil
}

func (s *memBlobs) LoadBlob(_ context.Context, _ BlobType, id ID) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.m[id]
	if !ok {
		return nil, fmt.Errorf("blob %s: %w", id.Short(), errdefs.ErrNotFound)
	}
	if Hash(d) != id {
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
func overlayish(_ string, st *unix.Stat_t, e *Entry) (bool, error) {
	if e.Type == TypeCharDev && e.Rdev == 0 {
		*e = Entry{Name: e.Name, Type: TypeWhiteout}
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
	time.Sleep(2 * racyWindow)
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
	dev := &Tree{Entries: []Entry{{Name: "sda", Type: TypeBlockDev, Mode: 0o660, Rdev: unix.Mkdev(8, 0)}}}
	data := dev.Encode()
	id := Hash(data)
	mem.SaveBlob(ctx, BlobTree, id, data)
	_, err := Materialise(ctx, id, t.TempDir(), ApplyOptions{Loader: mem})
	if !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("device node: got %v, want ErrPrecondition", err)
	}
	chunk := []byte("content")
	cid := Hash(chunk)
	mem.SaveBlob(ctx, BlobData, cid, chunk)
	ft := &Tree{Entries: []Entry{{Name: "f", Type: TypeFile, Mode: 0o644, Size: 7, Chunks: []ID{cid}}}}
	fdata := ft.Encode()
	fid := Hash(fdata)
	mem.SaveBlob(ctx, BlobTree, fid, fdata)
	mem.m[cid][0] ^= 1
	_, err = Materialise(ctx, fid, t.TempDir(), ApplyOptions{Loader: mem})
	if !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("corrupt chunk: got %v, want ErrCorrupt", err)
	}
}

func TestDecodeTreeRejectsNonCanonical(t *testing.T) {
	good := &Tree{Entries: []Entry{
		{Name: "a", Type: TypeFile, Mode: 0o644, Size: 1, Chunks: []ID{Hash([]byte("x"))}},
		{Name: "b", Type: TypeSymlink, Mode: 0o777, Target: "a"},
	}}
	data := good.Encode()
	back, err := DecodeTree(data)
	must(t, err)
	if !bytes.Equal(back.Encode(), data) {
		t.Fatal("round trip changed the encoding")
	}
	swapped := &Tree{Entries: []Entry{good.Entries[1], good.Entries[0]}}
	if _, err := DecodeTree(swapped.Encode()); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("unsorted tree accepted: %v", err)
	}
	for _, bad := range []string{"..", ".", "a/b", ""} {
		tr := &Tree{Entries: []Entry{{Name: bad, Type: TypeFIFO}}}
		if _, err := DecodeTree(tr.Encode()); err == nil {
			t.Errorf("name %q accepted", bad)
		}
	}
	if _, err := DecodeTree(append(data, 0)); err == nil {
		t.Error("trailing byte accepted")
	}
	for i := range data {
		c := bytes.Clone(data)
		c[i] ^= 0x40
		if tr, err := DecodeTree(c); err == nil && bytes.Equal(tr.Encode(), data) {
			t.Errorf("flip at %d decoded to the original tree", i)
		}
	}
}

func FuzzDecodeTree(f *testing.F) {
	f.Add((&Tree{Entries: []Entry{{Name: "a", Type: TypeDir, Mode: 0o755, Subtree: Hash(nil)}}}).Encode())
	f.Add([]byte("TST")) // once crashed the magic check
	// Sparse files (version 2): a good hole list, and hostile ones.
	c := Hash([]byte("x"))
	for _, holes := range [][]Hole{{{0, 4096}, {8192, 1 << 30}}, {{0, 0}}, {{5, 10}, {0, 3}}, {{0, 10}, {10, 1}}, {{1 << 43, 1 << 43}}} {
		f.Add((&Tree{Entries: []Entry{{Name: "f", Type: TypeFile, Mode: 0o644, Size: 8193 + 1<<30, Chunks: []ID{c}, Holes: holes}}}).Encode())
	}
	// Indirect chunk lists (version 3): a file naming a list.
	v3 := &Tree{Entries: []Entry{{Name: "big", Type: TypeFile, Mode: 0o644, Size: 40 * ChunkAverage, Chunks: chunkIDs(40)}}}
	v3.MakeIndirect(IDs{})
	f.Add(v3.Encode())
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := DecodeTree(data)
		if err == nil && !bytes.Equal(tr.Encode(), data) {
			t.Fatal("accepted a non-canonical encoding")
		}
	})
}

func TestDiffLayers(t *testing.T) {
	ctx := context.Background()
	mem := newMem()
	put := func(tr *Tree) ID {
		tr.Sort()
		d := tr.Encode()
		id := Hash(d)
		mem.SaveBlob(ctx, BlobTree, id, d)
		return id
	}
	f := func(name, content string) Entry {
		return Entry{Name: name, Type: TypeFile, Mode: 0o644, Size: uint64(len(content)), Chunks: []ID{Hash([]byte(content))}}
	}
	sub := put(&Tree{Entries: []Entry{f("x", "1"), f("y", "2")}})
	base := put(&Tree{Entries: []Entry{f("keep", "k"), f("del", "d"), {Name: "dir", Type: TypeDir, Mode: 0o755, Subtree: sub}}})
	upper := put(&Tree{Entries: []Entry{
		{Name: "del", Type: TypeWhiteout},
		f("new", "n"),
		{Name: "dir", Type: TypeDir, Mode: 0o755, Subtree: put(&Tree{Entries: []Entry{f("x", "changed")}})},
	}})
	opaque := put(&Tree{Entries: []Entry{{Name: "dir", Type: TypeDir, Mode: 0o755, Opaque: true, Subtree: EmptyTree()}}})
	mem.SaveBlob(ctx, BlobTree, EmptyTree(), (&Tree{}).Encode())
	// What a change is, without the entries it carries.
	kinds := func(cs []Change) []Change {
		out := []Change{}
		for _, c := range cs {
			out = append(out, Change{Kind: c.Kind, Path: c.Path, Type: c.Type})
		}
		return out
	}
	got, err := Diff(ctx, mem, Layers{base, EmptyTree()}, Layers{base, upper})
	must(t, err)
	got = kinds(got)
	want := []Change{{Kind: Deleted, Path: "del", Type: TypeFile}, {Kind: Modified, Path: "dir/x", Type: TypeFile}, {Kind: Added, Path: "new", Type: TypeFile}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("diff = %v, want %v", got, want)
	}
	got, err = Diff(ctx, mem, Layers{base, upper}, Layers{base, opaque})
	must(t, err)
	got = kinds(got)
	want = []Change{{Kind: Added, Path: "del", Type: TypeFile}, {Kind: Deleted, Path: "dir/x", Type: TypeFile}, {Kind: Deleted, Path: "dir/y", Type: TypeFile}, {Kind: Deleted, Path: "new", Type: TypeFile}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("opaque diff = %v, want %v", got, want)
	}
}

// The small-file fast path must cut exactly as the chunker does.
func TestChunkFastPathMatchesChunker(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	for _, size := range []int{0, 1, 100, ChunkMin - 1, ChunkMin, ChunkMin + 1, ChunkMax, 3*ChunkMax + 17, 5 << 20} {
		data := make([]byte, size)
		rng.Read(data)
		var viaChunker, viaSized []ID
		must(t, ChunkReader(bytes.NewReader(data), func(c []byte) error { viaChunker = append(viaChunker, Hash(c)); return nil }))
		must(t, NewChunker().Chunk(bytes.NewReader(data), int64(size), func(c []byte) error {
			viaSized = append(viaSized, Hash(c))
			return nil
		}))
		if fmt.Sprint(viaChunker) != fmt.Sprint(viaSized) {
			t.Errorf("size %d: fast path cut %d chunks, chunker %d", size, len(viaSized), len(viaChunker))
		}
	}
}
