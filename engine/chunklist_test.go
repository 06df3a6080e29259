package engine

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/retention"
)

// writeRandom writes size bytes of seeded pseudo-random (incompressible,
// all-distinct-chunk) data to p, 1 MiB at a time.
func writeRandom(t testing.TB, p string, size int64, seed uint64) {
	t.Helper()
	f, err := os.Create(p)
	must(t, err)
	defer f.Close()
	r := rand.NewChaCha8([32]byte{byte(seed)})
	buf := make([]byte, 1<<20)
	for n := int64(0); n < size; n += int64(len(buf)) {
		r.Read(buf)
		if _, err := f.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	must(t, f.Close())
}

// hugeFileSize is the unchanged file of TestSmallChangeNextToHugeFile: big
// enough that its chunk list (about 4,000 chunks, 128 KiB inline) is long,
// small enough to write, scan, verify and restore in seconds on a shared
// test machine (1 GiB took five minutes there). What a turn stores next to
// it does not grow with its size: a 10 GiB file names one list as this one
// does. A sparse file would not do: its holes are not chunks, so its list
// is short.
const hugeFileSize = 256 << 20

// TestSmallChangeNextToHugeFile is issue 24, item 6a: a turn that writes a
// 2-byte file next to an unchanged huge file stores at most 2 KiB; before
// chunk lists it stored the huge file's whole inline chunk list (32 bytes
// per chunk) every turn. The state then rolls back, branches and verifies,
// and garbage collection keeps the list and its chunks.
func TestSmallChangeNextToHugeFile(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr := smallSandbox(t, e, "s")
	huge := filepath.Join(cr.Root, "huge.bin")
	writeRandom(t, huge, hugeFileSize, 24)
	first, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	t.Logf("turn 0 (the huge file): %d bytes new", first.Stats.BytesNew)
	var worst int64
	var mid *CheckpointResult
	for i := range 4 {
		write(t, filepath.Join(cr.Root, "n.txt"), fmt.Sprintf("%02d", i))
		cp, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
		must(t, err)
		if cp.Class != delta.ClassFS {
			t.Fatalf("turn %d: class %s", i+1, cp.Class)
		}
		t.Logf("turn %d (2 bytes next to it): %d bytes new, %d blobs, %d objects", i+1, cp.Stats.BytesNew, cp.Stats.BlobsNew, cp.Stats.ObjectsNew)
		worst = max(worst, cp.Stats.BytesNew)
		if i == 1 {
			mid = cp
		}
	}
	if worst > 2<<10 {
		t.Fatalf("a 2-byte change next to an unchanged %d-byte file stored %d bytes in a turn, want at most 2 KiB", int64(hugeFileSize), worst)
	}
	checkAll(t, e) // refcounts recounted through the chunk list, every checkpoint verified

	want := fileDigest(t, huge)
	_, err = e.Rollback(ctx, "s", mustRef(mid.ID.String()), RollbackOptions{})
	must(t, err)
	if got, _ := os.ReadFile(filepath.Join(cr.Root, "n.txt")); string(got) != "01" || fileDigest(t, huge) != want {
		t.Fatalf("rollback: n.txt %q, huge file same %v", got, fileDigest(t, huge) == want)
	}
	br, err := e.Branch(ctx, mustRef(mid.ID.String()), "b", BranchOptions{})
	must(t, err)
	if fileDigest(t, filepath.Join(br.Root, "huge.bin")) != want {
		t.Fatal("branch: the huge file differs")
	}
	if _, err := e.Retention().GC(ctx, retention.GCOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Verifier().VerifyStore(ctx, mustRef("")); err != nil {
		t.Fatalf("store-only verify after gc: %v", err)
	}
}

func fileDigest(t testing.TB, p string) delta.ID {
	t.Helper()
	b, err := os.ReadFile(p)
	must(t, err)
	if bytes.Count(b[:min(len(b), 1<<20)], []byte{0}) == len(b[:min(len(b), 1<<20)]) && len(b) > 0 {
		t.Fatalf("%s starts with zeros: not the written file", p)
	}
	return delta.Hash(b)
}

// TestChunkListsSealedPushedRebuilt: a large file's chunk list in an
// encrypted home (keyed IDs, sealed packs) is pushed with the packs its
// checkpoint needs, found by a fresh home's catalog rebuild, counted,
// verified and restored; each turn next to it stores the list no more;
// pruning releases a list no checkpoint names, and its chunks.
func TestChunkListsSealedPushedRebuilt(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	rc := RemoteConfig{URL: "s3://lists/home", Endpoint: srv.Endpoint, Insecure: true}
	key := keyFile(t)
	e := newEngine(t)
	_, err := e.HomeSetup().Setup(ctx, SetupOptions{Remote: &rc, KeyFile: key})
	must(t, err)
	cr := smallSandbox(t, e, "s")
	big := filepath.Join(cr.Root, "big.bin")
	writeRandom(t, big, 4<<20, 5) // about 64 chunks: more than an inline list holds
	_, err = e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	write(t, filepath.Join(cr.Root, "n.txt"), "ab")
	c2, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	if c2.Stats.BytesNew > 2<<10 {
		t.Fatalf("a 2-byte turn next to the file stored %d bytes", c2.Stats.BytesNew)
	}
	cp, err := e.resolveFor(ctx, "", mustRef(c2.ID.String()))
	must(t, err)
	tr, err := delta.LoadTreeShallow(ctx, e.data.repo, cp.FSTree)
	must(t, err)
	if en := tr.Find("big.bin"); en == nil || !en.Indirect() || en.NChunks < 40 {
		t.Fatalf("the file does not name a chunk list: %+v", en)
	}
	checkAll(t, e)
	_, err = e.Remote().Push(ctx, PushOptions{})
	must(t, err)

	f := newEngine(t)
	_, err = f.HomeSetup().Setup(ctx, SetupOptions{Remote: &rc, KeyFile: key})
	must(t, err)
	rep, err := f.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	if rep == nil {
		t.Fatal("no rebuild report")
	}
	checkAll(t, f) // refcounts of the rebuilt catalog recounted through the list
	_, err = f.Verifier().Verify(ctx, mustRef(c2.ID.String()))
	must(t, err)
	br, err := f.Branch(ctx, mustRef(c2.ID.String()), "copy", BranchOptions{})
	must(t, err)
	if fileDigest(t, filepath.Join(br.Root, "big.bin")) != fileDigest(t, big) {
		t.Fatal("the restored file differs")
	}

	// The file changes (a new list); pruning the checkpoints that named
	// the old list releases it, and through it its chunks: the catalog's
	// counts then equal a recount (checkAll), none left over.
	fh, err := os.OpenFile(big, os.O_WRONLY, 0)
	must(t, err)
	_, err = fh.WriteAt([]byte("changed in the middle"), 2<<20)
	must(t, err)
	must(t, fh.Close())
	_, err = e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	_, err = e.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 1})
	must(t, err)
	checkAll(t, e)
}
