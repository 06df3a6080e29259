package lazy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"golang.org/x/sys/unix"
)

// These tests need root, an ext4 or btrfs temporary directory (pre-content
// marks are refused on tmpfs), overlayfs and a real MinIO server on
// 127.0.0.1 (built into $TURNSNAP_CACHE/bin/minio by
// scripts/deps.d/40-minio.sh).

// TestFirstAccessThroughOverlayReturnsTheStoredBytes restores a layer as
// placeholders, mounts it as an overlay upper, and reads every file through
// the mount the ways a sandbox does (read, mmap, exec, truncate): each
// returns the stored bytes, each chunk is fetched once, and the layer ends
// whole, scanning to its tree.
func TestFirstAccessThroughOverlayReturnsTheStoredBytes(t *testing.T) {
	_, b, src, tree, l := storedSample(t)
	f, err := Restore(context.Background(), l.config(b, tree))
	must(t, err)
	defer f.Close()
	if n := len(b.dataLoads()); n != 0 {
		t.Fatalf("placeholders fetched %d chunks; want none", n)
	}
	st, err := ReadState(l.dir)
	must(t, err)
	if !st.Incomplete || !st.Ready || st.Tree != tree {
		t.Fatalf("state %+v, want incomplete, ready, tree %s", st, tree.Short())
	}
	// A placeholder has its size and metadata and no data block.
	var sst unix.Stat_t
	must(t, unix.Stat(filepath.Join(l.upper, "data/big.bin"), &sst))
	if sst.Size != 3<<20+12345 || sst.Blocks != 0 {
		t.Fatalf("placeholder size %d blocks %d, want %d and 0", sst.Size, sst.Blocks, 3<<20+12345)
	}
	l.mount(t)

	// exec of a placeholder script, from another process.
	out, err := exec.Command(filepath.Join(l.mnt, "bin/tool.sh")).CombinedOutput()
	if err != nil || string(out) != "tool-ran\n" {
		t.Fatalf("exec placeholder: %q %v", out, err)
	}
	// mmap, which through overlay raises no pre-access event of its own.
	mf, err := os.Open(filepath.Join(l.mnt, "data/big.bin"))
	must(t, err)
	m, err := unix.Mmap(int(mf.Fd()), 0, 3<<20+12345, unix.PROT_READ, unix.MAP_SHARED)
	must(t, err)
	want, err := os.ReadFile(filepath.Join(src, "data/big.bin"))
	must(t, err)
	if !bytes.Equal(m, want) {
		t.Fatal("mmap of a placeholder through overlay: not the stored bytes")
	}
	must(t, unix.Munmap(m))
	mf.Close()
	// Every file read through the mount.
	must(t, filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		got, err := os.ReadFile(filepath.Join(l.mnt, rel))
		if err != nil {
			return err
		}
		w, _ := os.ReadFile(p)
		if !bytes.Equal(got, w) {
			return fmt.Errorf("/%s through the mount: %d bytes, not the stored %d", rel, len(got), len(w))
		}
		return nil
	}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	must(t, f.Wait(ctx))
	for id, n := range b.dataLoads() {
		if n != 1 {
			t.Errorf("chunk %s fetched %d times", id.Short(), n)
		}
	}
	if s := f.Stats(); s.Pending != 0 || s.OnDemand != s.Filled || s.FailedFills != 0 {
		t.Errorf("stats %+v: want nothing pending, every fill on demand, none failed", s)
	}
	if st, _ := ReadState(l.dir); st.Incomplete {
		t.Fatal("state file left after the layer was whole")
	}
	must(t, unix.Unmount(l.mnt, 0))
	sameTree(t, l.upper, tree)
}

// TestTruncateByPathKeepsTheStoredHead: truncate(2) by path through overlay
// opens nothing and raises no event on this kernel (measured), so the fill
// that follows must keep the cut size and write only the stored head.
func TestTruncateByPathKeepsTheStoredHead(t *testing.T) {
	_, b, src, tree, l := storedSample(t)
	f, err := Restore(context.Background(), l.config(b, tree))
	must(t, err)
	defer f.Close()
	l.mount(t)
	must(t, unix.Truncate(filepath.Join(l.mnt, "src/mod07.py"), 30))
	got, err := os.ReadFile(filepath.Join(l.mnt, "src/mod07.py"))
	must(t, err)
	want, _ := os.ReadFile(filepath.Join(src, "src/mod07.py"))
	if !bytes.Equal(got, want[:30]) {
		t.Fatalf("after truncate: %q, want %q", got, want[:30])
	}
}

// TestConcurrentReadersFetchOnce: 16 readers open the same large file and
// 40 small ones at once, and fetch-ahead runs beside them; every reader
// gets the stored bytes and no chunk is fetched twice.
func TestConcurrentReadersFetchOnce(t *testing.T) {
	_, b, src, tree, l := storedSample(t)
	b.delay = 2 * time.Millisecond // keep fills in flight while others arrive
	f, err := Restore(context.Background(), l.config(b, tree))
	must(t, err)
	defer f.Close()
	l.mount(t)
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	read := func(rel string) {
		defer wg.Done()
		got, err := os.ReadFile(filepath.Join(l.mnt, rel))
		w, _ := os.ReadFile(filepath.Join(src, rel))
		if err == nil && !bytes.Equal(got, w) {
			err = fmt.Errorf("/%s: wrong bytes", rel)
		}
		if err != nil {
			errs <- err
		}
	}
	for range 16 {
		wg.Add(1)
		go read("data/big.bin")
	}
	for i := range 40 {
		wg.Add(2)
		go read(fmt.Sprintf("src/mod%02d.py", i))
		go read(fmt.Sprintf("src/mod%02d.py", 39-i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := f.FetchAhead(ctx, nil); err != nil {
			errs <- err
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for id, n := range b.dataLoads() {
		if n != 1 {
			t.Errorf("chunk %s fetched %d times", id.Short(), n)
		}
	}
	s := f.Stats()
	if s.Pending != 0 || s.Filled != 46 {
		t.Errorf("stats %+v: want 46 files filled (the hardlink pair once), none pending", s)
	}
	must(t, unix.Unmount(l.mnt, 0))
	sameTree(t, l.upper, tree)
}

// TestMissingObjectFailsTheAccessNamingIt: a chunk gone from the bucket
// makes the access fail with EIO (never the placeholder's zeros), and the
// error names the object and the sandbox; the other files still restore,
// and the layer stays incomplete.
func TestMissingObjectFailsTheAccessNamingIt(t *testing.T) {
	_, b, src, tree, l := storedSample(t)
	gone := delta.Hash([]byte("key = value\n"))
	f, err := Restore(context.Background(), l.config(b, tree))
	must(t, err)
	defer f.Close()
	must(t, b.store.Delete(context.Background(), blobName(gone)))
	l.mount(t)
	_, err = os.ReadFile(filepath.Join(l.mnt, "etc/config"))
	if !errors.Is(err, unix.EIO) {
		t.Fatalf("read of a file whose chunk is gone: %v, want EIO", err)
	}
	ferr := f.Err()
	if ferr == nil || !strings.Contains(ferr.Error(), blobName(gone)) || !strings.Contains(ferr.Error(), "sandbox lazybox") || !strings.Contains(ferr.Error(), "/etc/config") {
		t.Fatalf("fill error %v: want the object %s, the sandbox and the path named", ferr, blobName(gone))
	}
	got, err := os.ReadFile(filepath.Join(l.mnt, "src/mod01.py"))
	must(t, err)
	if w, _ := os.ReadFile(filepath.Join(src, "src/mod01.py")); !bytes.Equal(got, w) {
		t.Fatal("another file after a failed fill: wrong bytes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = f.FetchAhead(ctx, nil)
	if err == nil || !strings.Contains(err.Error(), blobName(gone)) {
		t.Fatalf("fetch-ahead: %v, want it to name %s", err, blobName(gone))
	}
	if st, _ := ReadState(l.dir); !st.Incomplete {
		t.Fatal("a layer with an unfilled file was marked whole")
	}
	if f.Stats().Pending != 1 {
		t.Fatalf("pending %d, want the one inode of etc/config and its link", f.Stats().Pending)
	}
}
