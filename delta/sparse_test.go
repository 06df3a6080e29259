package delta

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

// sparseGiB is the file: 1 GiB holding 8 KiB of data at two offsets.
func writeSparseGiB(t *testing.T, p string) (a, b []byte) {
	t.Helper()
	f, err := os.Create(p)
	must(t, err)
	defer f.Close()
	must(t, f.Truncate(1<<30))
	a, b = bytes.Repeat([]byte("A sparse file's first run. "), 152)[:4096], bytes.Repeat([]byte{0xb7}, 4096)
	_, err = f.WriteAt(a, 100<<20)
	must(t, err)
	_, err = f.WriteAt(b, 900<<20)
	must(t, err)
	return a, b
}

func readAt(t *testing.T, p string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(p)
	must(t, err)
	defer f.Close()
	buf := make([]byte, n)
	_, err = f.ReadAt(buf, off)
	must(t, err)
	return buf
}

func diskBytes(t *testing.T, p string) int64 {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Stat(p, &st))
	return st.Blocks * 512
}

// TestSparseFileScanAndRestore: a 1 GiB file with 8 KiB of data is read
// for its 8 KiB only, stored in a few KiB, and restored with its holes,
// using about 8 KiB of disk; the restore re-derives the same tree.
func TestSparseFileScanAndRestore(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	src := t.TempDir()
	a, b := writeSparseGiB(t, filepath.Join(src, "disk.img"))
	mem := newMem()
	res, err := Scan(ctx, src, ScanOptions{Saver: mem})
	must(t, err)
	if res.Stats.FilesRead != 1 || res.Stats.BytesRead != 8192 {
		t.Fatalf("scan read %d files, %d bytes; want 1 file, 8192 bytes", res.Stats.FilesRead, res.Stats.BytesRead)
	}
	stored := 0
	for _, d := range mem.m {
		stored += len(d)
	}
	if stored > 16<<10 {
		t.Fatalf("stored %d bytes of blobs for 8 KiB of data", stored)
	}
	tr, err := LoadTree(ctx, mem, res.Root)
	must(t, err)
	e := tr.Find("disk.img")
	if e == nil || e.Size != 1<<30 || len(e.Holes) != 3 || e.DataSize() != 8192 {
		t.Fatalf("entry %+v: want 1 GiB, 3 holes, 8192 data bytes", e)
	}
	if enc := tr.Encode(); enc[3] != treeVersionSparse {
		t.Fatalf("tree version %d, want %d", enc[3], treeVersionSparse)
	}
	for _, apply := range []struct {
		name string
		fn   func(context.Context, ID, string, ApplyOptions) (ApplyStats, error)
	}{{"materialise", Materialise}, {"apply-layer", ApplyLayer}} {
		t.Run(apply.name, func(t *testing.T) {
			dst := t.TempDir()
			if apply.name == "apply-layer" {
				// Onto an old full copy of the name: the layer replaces it.
				must(t, os.WriteFile(filepath.Join(dst, "disk.img"), bytes.Repeat([]byte{1}, 1<<20), 0o644))
			}
			st, err := apply.fn(ctx, res.Root, dst, ApplyOptions{Loader: mem})
			must(t, err)
			p := filepath.Join(dst, "disk.img")
			if st.Bytes != 8192 {
				t.Errorf("wrote %d data bytes, want 8192", st.Bytes)
			}
			if used := diskBytes(t, p); used > 64<<10 {
				t.Errorf("restored file uses %d bytes of disk, want about 8 KiB", used)
			}
			fi, err := os.Stat(p)
			must(t, err)
			if fi.Size() != 1<<30 {
				t.Fatalf("size %d", fi.Size())
			}
			if !bytes.Equal(readAt(t, p, 100<<20, 4096), a) || !bytes.Equal(readAt(t, p, 900<<20, 4096), b) ||
				!bytes.Equal(readAt(t, p, 500<<20, 4096), make([]byte, 4096)) {
				t.Fatal("restored content differs")
			}
			again, err := Scan(ctx, dst, ScanOptions{})
			must(t, err)
			if again.Root != res.Root {
				t.Fatalf("restored state hashes to %s, want %s", again.Root.Short(), res.Root.Short())
			}
		})
	}
}

// TestWriteContentInPlacePunchesHoles: rewriting an existing full file
// with a sparse entry leaves only the entry's data allocated.
func TestWriteContentInPlacePunchesHoles(t *testing.T) {
	ctx := context.Background()
	mem := newMem()
	data := bytes.Repeat([]byte("d"), 4096)
	id := Hash(data)
	mem.SaveBlob(ctx, BlobData, id, data)
	e := &Entry{Name: "f", Type: TypeFile, Size: 8 << 20, Chunks: []ID{id}, Holes: []Hole{{0, 4 << 20}, {4<<20 + 4096, 4<<20 - 4096}}}
	p := filepath.Join(t.TempDir(), "f")
	must(t, os.WriteFile(p, bytes.Repeat([]byte{9}, 12<<20), 0o644))
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	must(t, err)
	n, err := WriteContent(ctx, mem, f, e, true)
	must(t, err)
	must(t, f.Close())
	if n != 4096 {
		t.Fatalf("wrote %d", n)
	}
	if used := diskBytes(t, p); used > 64<<10 {
		t.Fatalf("in-place rewrite uses %d bytes of disk", used)
	}
	if !bytes.Equal(readAt(t, p, 4<<20, 4096), data) || !bytes.Equal(readAt(t, p, 0, 4096), make([]byte, 4096)) {
		t.Fatal("content differs")
	}
	if fi, _ := os.Stat(p); fi.Size() != 8<<20 {
		t.Fatalf("size %d", fi.Size())
	}
}

// buildPlainFixture writes a directory whose every recorded field is fixed.
func buildPlainFixture(t *testing.T, dir string) {
	t.Helper()
	big := bytes.Repeat([]byte("all data, no holes: the tree of this file was made before sparse files existed\n"), 40000)
	files := map[string][]byte{"big": big, "small": []byte("hello\n"), "sub/empty": nil, "sub/zeros": make([]byte, 300<<10)}
	must(t, os.MkdirAll(filepath.Join(dir, "sub"), 0o755))
	for name, data := range files {
		p := filepath.Join(dir, name)
		must(t, os.WriteFile(p, data, 0o644))
	}
	ts := []unix.Timespec{{Sec: 1700000000, Nsec: 5}, {Sec: 1700000000, Nsec: 5}}
	for _, name := range []string{"big", "small", "sub/empty", "sub/zeros", "sub"} {
		p := filepath.Join(dir, name)
		must(t, os.Lchown(p, 0, 0))
		must(t, unix.UtimesNano(p, ts))
	}
}

// goldenPlainRoot is the ID of buildPlainFixture's tree as the code before
// sparse files computed it (turnsnap 0a85e9b): trees without holes keep
// their bytes and IDs, so existing checkpoints deduplicate.
const goldenPlainRoot = "fee32dc1b8d2ef9daf706f49110fff490cd1cc1fcd821b3741cff126e312d87c"

func TestPlainFileTreeIDUnchanged(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	buildPlainFixture(t, dir)
	for _, workers := range []int{1, 4} {
		res, err := Scan(context.Background(), dir, ScanOptions{Saver: newMem(), Workers: workers})
		must(t, err)
		if res.Root.String() != goldenPlainRoot {
			t.Fatalf("workers %d: root %s, want %s", workers, res.Root, goldenPlainRoot)
		}
	}
}

func sparseTree(holes []Hole, size uint64, chunks ...ID) *Tree {
	return &Tree{Entries: []Entry{{Name: "f", Type: TypeFile, Mode: 0o644, Size: size, Chunks: chunks, Holes: holes}}}
}

// TestHostileHoleLists: every broken hole list is corruption, at decode or
// before a restore, and the error names the tree or the path.
func TestHostileHoleLists(t *testing.T) {
	ctx := context.Background()
	c := Hash([]byte("x"))
	good := sparseTree([]Hole{{0, 4096}, {8192, 4096}}, 16384, c)
	if _, err := DecodeTree(good.Encode()); err != nil {
		t.Fatalf("good sparse tree refused: %v", err)
	}
	tooMany := make([]Hole, MaxHoles+1)
	for i := range tooMany {
		tooMany[i] = Hole{uint64(2*i + 1), 1}
	}
	for name, tr := range map[string]*Tree{
		"empty hole":      sparseTree([]Hole{{0, 0}}, 10, c),
		"overlapping":     sparseTree([]Hole{{0, 10}, {5, 10}}, 100, c),
		"adjacent":        sparseTree([]Hole{{0, 10}, {10, 10}}, 100, c),
		"unsorted":        sparseTree([]Hole{{50, 10}, {0, 10}}, 100, c),
		"beyond size":     sparseTree([]Hole{{90, 20}}, 100, c),
		"starts beyond":   sparseTree([]Hole{{200, 1}}, 100, c),
		"huge size":       sparseTree([]Hole{{0, 1 << 62}}, 1<<62+1, c),
		"too many":        sparseTree(tooMany, uint64(2*len(tooMany)+2), c),
		"holes on a fifo": {Entries: []Entry{{Name: "p", Type: TypeFIFO, Holes: []Hole{{0, 1}}}}},
	} {
		_, err := DecodeTree(tr.Encode())
		if !errors.Is(err, errdefs.ErrCorrupt) {
			t.Errorf("%s: got %v, want ErrCorrupt", name, err)
		}
	}
	// A version 2 tree without holes is not canonical: it is a version 1 tree.
	v2 := append([]byte("TST\x02"), (&Tree{Entries: []Entry{{Name: "a", Type: TypeFile, Size: 1, Chunks: []ID{c}}}}).Encode()[4:]...)
	v2 = append(v2, 0) // the file's empty hole list
	if _, err := DecodeTree(v2); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Errorf("version 2 without holes: got %v", err)
	}
	// Version 3 (chunk lists) without a chunk list is not canonical either.
	if _, err := DecodeTree(append([]byte("TST\x03"), good.Encode()[4:]...)); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Errorf("version 3 without a chunk list: got %v", err)
	}
	if _, err := DecodeTree(append([]byte("TST\x04"), good.Encode()[4:]...)); err == nil || !strings.Contains(err.Error(), "version 4") {
		t.Errorf("version 4: got %v", err)
	}
	// Decodable, but the chunks cannot fill the data runs: refused before
	// a restore writes anything, naming the path.
	mem := newMem()
	mem.SaveBlob(ctx, BlobData, c, []byte("x"))
	for name, tr := range map[string]*Tree{
		"no chunks for data":  sparseTree([]Hole{{0, 4096}}, 1<<30),
		"chunks in no data":   sparseTree([]Hole{{0, 4096}}, 4096, c),
		"data beyond chunks":  sparseTree([]Hole{{0, 4096}}, 4096+ChunkMax+1, c),
		"chunk size mismatch": sparseTree([]Hole{{0, 4096}}, 4096+5, c),
	} {
		data := tr.Encode()
		id := Hash(data)
		mem.SaveBlob(ctx, BlobTree, id, data)
		_, err := CheckState(ctx, mem, id, StateRules{ChunkSize: func(ID) (uint64, error) { return 1, nil }})
		if !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), "/f") {
			t.Errorf("%s: got %v, want ErrCorrupt naming /f", name, err)
		}
		_, err = Materialise(ctx, id, t.TempDir(), ApplyOptions{Loader: mem})
		if !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), id.Short()) && !strings.Contains(err.Error(), ":/f") {
			t.Errorf("%s: materialise got %v, want ErrCorrupt naming the tree or the file", name, err)
		}
	}
}
