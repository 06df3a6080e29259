package fstree

import (
	"bytes"
	"context"
	"errors"
	"github.com/turnsnap/turnsnap/delta"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

// sparseTreeVersion is the tree encoding version of a tree with holes
// (docs/FORMAT.md).
const sparseTreeVersion = 2

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
	tr, err := delta.LoadTree(ctx, mem, res.Root)
	must(t, err)
	e := tr.Find("disk.img")
	if e == nil || e.Size != 1<<30 || len(e.Holes) != 3 || e.DataSize() != 8192 {
		t.Fatalf("entry %+v: want 1 GiB, 3 holes, 8192 data bytes", e)
	}
	if enc := tr.Encode(); enc[3] != sparseTreeVersion {
		t.Fatalf("tree version %d, want %d", enc[3], sparseTreeVersion)
	}
	for _, apply := range []struct {
		name string
		fn   func(context.Context, delta.ID, string, ApplyOptions) (ApplyStats, error)
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
	id := delta.Hash(data)
	mem.SaveBlob(ctx, delta.BlobData, id, data)
	e := &delta.Entry{Name: "f", Type: delta.TypeFile, Size: 8 << 20, Chunks: []delta.ID{id}, Holes: []delta.Hole{{Off: 0, Len: 4 << 20}, {Off: 4<<20 + 4096, Len: 4<<20 - 4096}}}
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

func holeyTree(holes []delta.Hole, size uint64, chunks ...delta.ID) *delta.Tree {
	return &delta.Tree{Entries: []delta.Entry{{Name: "f", Type: delta.TypeFile, Mode: 0o644, Size: size, Chunks: chunks, Holes: holes}}}
}

// TestMaterialiseRefusesHostileHoles: a decodable tree whose chunks cannot
// fill its data runs is refused before a restore writes anything, and the
// error names the tree or the path (the decoding side is delta's
// TestHostileHoleLists).
func TestMaterialiseRefusesHostileHoles(t *testing.T) {
	ctx := context.Background()
	c := delta.Hash([]byte("x"))
	mem := newMem()
	mem.SaveBlob(ctx, delta.BlobData, c, []byte("x"))
	for name, tr := range map[string]*delta.Tree{
		"no chunks for data":  holeyTree([]delta.Hole{{Off: 0, Len: 4096}}, 1<<30),
		"chunks in no data":   holeyTree([]delta.Hole{{Off: 0, Len: 4096}}, 4096, c),
		"data beyond chunks":  holeyTree([]delta.Hole{{Off: 0, Len: 4096}}, 4096+delta.ChunkMax+1, c),
		"chunk size mismatch": holeyTree([]delta.Hole{{Off: 0, Len: 4096}}, 4096+5, c),
	} {
		data := tr.Encode()
		id := delta.Hash(data)
		mem.SaveBlob(ctx, delta.BlobTree, id, data)
		_, err := Materialise(ctx, id, t.TempDir(), ApplyOptions{Loader: mem})
		if !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), id.Short()) && !strings.Contains(err.Error(), ":/f") {
			t.Errorf("%s: materialise got %v, want ErrCorrupt naming the tree or the file", name, err)
		}
	}
}
