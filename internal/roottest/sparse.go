package roottest

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/fstree"
	"golang.org/x/sys/unix"
)

// Bytes is the plaintext size of everything stored.
func (m *MemStore) Bytes() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for _, d := range m.blobs {
		n += int64(len(d))
	}
	return n
}

// sparseRuns are the two 4 KiB data runs of the conformance suite's
// 1 GiB sparse file.
var sparseRuns = []struct {
	off  int64
	data []byte
}{
	{100 << 20, bytes.Repeat([]byte("sparse run one "), 274)[:4096]},
	{900 << 20, bytes.Repeat([]byte{0xa5}, 4096)},
}

// WriteSparse creates p as a 1 GiB file holding 8 KiB of data at two
// offsets (the example: a disk image, a database's preallocation).
func WriteSparse(t testing.TB, p string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	f, err := os.Create(p)
	must(t, err)
	defer f.Close()
	must(t, f.Truncate(1<<30))
	for _, r := range sparseRuns {
		_, err := f.WriteAt(r.data, r.off)
		must(t, err)
	}
}

// CheckSparse fails unless p is WriteSparse's file, content and holes:
// at most 64 KiB of disk (8 KiB of data and the filesystem's rounding).
func CheckSparse(t testing.TB, p string) {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Stat(p, &st))
	if st.Size != 1<<30 {
		t.Fatalf("%s: size %d, want 1 GiB", p, st.Size)
	}
	if used := st.Blocks * 512; used > 64<<10 {
		t.Fatalf("%s: uses %d bytes of disk, want about 8 KiB: its holes were filled", p, used)
	}
	f, err := os.Open(p)
	must(t, err)
	defer f.Close()
	buf := make([]byte, 4096)
	for _, r := range sparseRuns {
		_, err := f.ReadAt(buf, r.off)
		must(t, err)
		if !bytes.Equal(buf, r.data) {
			t.Fatalf("%s: data at %d differs", p, r.off)
		}
	}
	_, err = f.ReadAt(buf, 500<<20)
	must(t, err)
	if !bytes.Equal(buf, make([]byte, 4096)) {
		t.Fatalf("%s: a hole reads as non-zero", p)
	}
}

// testSparseFiles: a 1 GiB file holding 8 KiB checkpoints without being
// read in full, is stored in a few KiB, and comes back sparse from a
// rollback and in a branch.
func testSparseFiles(t *testing.T, s Setup) {
	f := newFixture(t, s)
	r, _ := f.create("sb", f.s.IDs.EmptyTree())
	root := r.Path()
	img := filepath.Join(root, "var/lib/disk.img")
	WriteSparse(t, img)
	Settle()
	before := f.store.Bytes()
	a := f.checkpoint(r)
	if a.Stats.BytesRead > 64<<10 {
		t.Fatalf("checkpoint read %d bytes of a file holding 8 KiB", a.Stats.BytesRead)
	}
	if grew := f.store.Bytes() - before; grew > 64<<10 {
		t.Fatalf("checkpoint stored %d bytes for 8 KiB of data", grew)
	}
	e := f.entryAt(a.Root, "var/lib/disk.img")
	if e == nil || len(e.Holes) == 0 || e.Size != 1<<30 {
		t.Fatalf("entry %+v: want a 1 GiB file with holes", e)
	}
	ha := Merged(t, root)
	// The agent fills the file with data and the turn is rolled back.
	must(t, os.WriteFile(img, bytes.Repeat([]byte{1}, 1<<20), 0o644))
	Settle()
	f.checkpoint(r)
	must(t, r.Restore(f.ctx, a.Root, f.store))
	CheckSparse(t, img)
	if got := Merged(t, root); got != ha {
		t.Fatalf("rollback hashes to %s, want %s", got.Short(), ha.Short())
	}
	br, _ := f.create("branch", a.Root)
	CheckSparse(t, filepath.Join(br.Path(), "var/lib/disk.img"))
	if got := Merged(t, br.Path()); got != ha {
		t.Fatalf("branch hashes to %s, want %s", got.Short(), ha.Short())
	}
}

// testLargeTurn: a turn past the ingest pipeline's threshold (several MiB
// of files in many directories, hashed and compressed on every core) is
// checkpointed completely: a branch of it holds the same files.
func testLargeTurn(t *testing.T, s Setup) {
	f := newFixture(t, s)
	r, _ := f.create("sb", f.s.IDs.EmptyTree())
	root := r.Path()
	for i := range 24 {
		data := bytes.Repeat([]byte{byte(i), byte(i * 7), 'x', '\n'}, 64<<10+i*4099) // 256 KiB and more each
		p := filepath.Join(root, "build", string(rune('a'+i%6)), "obj"+string(rune('a'+i)))
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, data, 0o644))
	}
	Settle()
	a := f.checkpoint(r)
	if a.Stats.BytesRead < 2*fstree.PipelineThreshold {
		t.Fatalf("read %d bytes: the turn is too small to start the pipeline", a.Stats.BytesRead)
	}
	br, _ := f.create("branch", a.Root)
	if got, want := Merged(t, br.Path()), Merged(t, root); got != want {
		t.Fatalf("branch of a large turn hashes to %s, the sandbox to %s", got.Short(), want.Short())
	}
}
