package lazy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/overlay"
	"github.com/turnsnap/turnsnap/upload"
	"golang.org/x/sys/unix"
)

// bucketBlobs keeps one object per blob in a real MinIO bucket, so every
// chunk a fill reads is a request to the server. It verifies what it reads
// against the blob's ID, as the engine's repository does, and counts the
// loads of each data chunk.
type bucketBlobs struct {
	store upload.Store
	delay time.Duration // per data chunk: lets a test kill a fill midway

	mu    sync.Mutex
	loads map[delta.ID]int
	// trees, when set, keeps every tree read: a host restores once the
	// checkpoint's metadata is local (the benchmark warms it).
	trees map[delta.ID][]byte
}

func blobName(id delta.ID) string { return "blobs/" + id.String() }

func (b *bucketBlobs) SaveBlob(ctx context.Context, _ delta.BlobType, id delta.ID, data []byte) (bool, error) {
	return true, b.store.Put(ctx, blobName(id), bytes.NewReader(data), int64(len(data)))
}

func (b *bucketBlobs) LoadBlob(ctx context.Context, t delta.BlobType, id delta.ID) ([]byte, error) {
	if t != delta.BlobData {
		b.mu.Lock()
		data, ok := b.trees[id]
		b.mu.Unlock()
		if ok {
			return data, nil
		}
		data, err := b.get(ctx, id)
		if err == nil && b.trees != nil {
			b.mu.Lock()
			b.trees[id] = data
			b.mu.Unlock()
		}
		return data, err
	}
	b.mu.Lock()
	b.loads[id]++
	b.mu.Unlock()
	if b.delay > 0 {
		time.Sleep(b.delay)
	}
	return b.get(ctx, id)
}

func (b *bucketBlobs) get(ctx context.Context, id delta.ID) ([]byte, error) {
	rc, err := b.store.Get(ctx, blobName(id))
	if err != nil {
		return nil, fmt.Errorf("object %s: %w", blobName(id), err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("object %s: %w", blobName(id), err)
	}
	if delta.Hash(data) != id {
		return nil, fmt.Errorf("object %s: content does not hash to its name: %w", blobName(id), errdefs.ErrCorrupt)
	}
	return data, nil
}

func (b *bucketBlobs) dataLoads() map[delta.ID]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[delta.ID]int, len(b.loads))
	for k, v := range b.loads {
		out[k] = v
	}
	return out
}

// bucketFromEnv connects to the MinIO server a parent test started (the
// kill test's child process).
func bucketFromEnv(ctx context.Context, endpoint string) (*bucketBlobs, error) {
	s, err := upload.NewS3(ctx, upload.S3Config{Endpoint: endpoint, Bucket: "lazy", Insecure: true, CreateBucket: true})
	if err != nil {
		return nil, err
	}
	return &bucketBlobs{store: s, loads: map[delta.ID]int{}}, nil
}

func startBucket(t testing.TB) (*miniotest.Server, *bucketBlobs) {
	t.Helper()
	srv := miniotest.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	b, err := bucketFromEnv(context.Background(), srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	return srv, b
}

// storedSample stores sample's files (written in src) in a fresh bucket
// and returns the server, the bucket, src, their tree and a layout to
// restore it into.
func storedSample(t testing.TB) (srv *miniotest.Server, b *bucketBlobs, src string, tree delta.ID, l layout) {
	t.Helper()
	srv, b = startBucket(t)
	src = t.TempDir()
	sample(t, src)
	return srv, b, src, stored(t, b, src), newLayout(t)
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// sample writes a directory whose files cover what a placeholder must
// carry: sizes from empty to several chunks, a sparse file, a hardlink
// pair, a setuid executable with a file capability, a symlink.
func sample(t testing.TB, dir string) {
	t.Helper()
	write := func(rel string, data []byte, mode os.FileMode) {
		p := filepath.Join(dir, rel)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, data, mode))
		must(t, os.Chmod(p, mode))
	}
	write("empty", nil, 0o644)
	write("etc/config", []byte("key = value\n"), 0o600)
	write("bin/tool.sh", []byte("#!/bin/sh\necho tool-ran\n"), 0o755)
	// Random, so no two of its chunks are equal (a repeated chunk is
	// loaded once per repetition, which would blur "fetched once").
	big := make([]byte, 3<<20+12345)
	_, _ = rand.NewChaCha8([32]byte{1}).Read(big)
	write("data/big.bin", big, 0o644)
	for i := range 40 {
		write(fmt.Sprintf("src/mod%02d.py", i), []byte(strings.Repeat(fmt.Sprintf("line %d of module %d\n", i, i), 50+i*10)), 0o644)
	}
	must(t, os.Link(filepath.Join(dir, "etc/config"), filepath.Join(dir, "etc/config.link")))
	must(t, os.Symlink("../data/big.bin", filepath.Join(dir, "bin/link")))
	sp, err := os.Create(filepath.Join(dir, "data/sparse"))
	must(t, err)
	_, err = sp.WriteAt([]byte("head"), 0)
	must(t, err)
	_, err = sp.WriteAt([]byte("tail"), 8<<20)
	must(t, err)
	must(t, sp.Close())
	write("bin/suid", []byte("#!/bin/sh\necho suid\n"), 0o755)
	must(t, os.Chmod(filepath.Join(dir, "bin/suid"), 0o4755))
	// A file capability (cap_net_raw+ep, VFS_CAP_REVISION_2): a write
	// removes it, so a fill must put it back.
	capv := []byte{0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00}
	must(t, unix.Setxattr(filepath.Join(dir, "bin/tool.sh"), "security.capability", capv, 0))
	must(t, unix.Setxattr(filepath.Join(dir, "etc/config"), "user.note", []byte("kept"), 0))
}

// stored scans src into the bucket and returns its tree.
func stored(t testing.TB, b *bucketBlobs, src string) delta.ID {
	t.Helper()
	res, err := fstree.Scan(context.Background(), src, fstree.ScanOptions{Saver: b})
	must(t, err)
	return res.Root
}

// layout is one root's directories: dir holds the state file, upper the
// placeholders, mnt the overlay mount over an empty lower.
type layout struct{ dir, lower, upper, work, mnt string }

func newLayout(t testing.TB) layout {
	t.Helper()
	return newLayoutIn(t, t.TempDir())
}

// newLayoutIn is newLayout in a new directory below parent.
func newLayoutIn(t testing.TB, parent string) layout {
	t.Helper()
	testenv.RequireRoot(t)
	d, err := os.MkdirTemp(parent, "layout-")
	must(t, err)
	l := layout{dir: d, lower: filepath.Join(d, "lower"), upper: filepath.Join(d, "upper"), work: filepath.Join(d, "work"), mnt: filepath.Join(d, "mnt")}
	for _, p := range []string{l.lower, l.upper, l.work, l.mnt} {
		must(t, os.Mkdir(p, 0o755))
	}
	return l
}

func (l layout) mount(t testing.TB) {
	t.Helper()
	opts, err := overlay.MountOptions(l.lower, l.upper, l.work)
	must(t, err)
	must(t, unix.Mount("overlay", l.mnt, "overlay", 0, opts))
	t.Cleanup(func() { _ = unix.Unmount(l.mnt, unix.MNT_DETACH) })
}

func (l layout) config(b *bucketBlobs, tree delta.ID) Config {
	return Config{Sandbox: "lazybox", Dir: l.dir, Upper: l.upper, Tree: tree, Loader: b}
}

// sameTree checks that dir scans to tree: every file's bytes, holes and
// metadata (xattrs, capability and setuid bit included) as stored, and no
// marker left.
func sameTree(t testing.TB, dir string, tree delta.ID) {
	t.Helper()
	res, err := fstree.Scan(context.Background(), dir, fstree.ScanOptions{})
	must(t, err)
	if res.Root != tree {
		t.Fatalf("%s scans to %s, want %s", dir, res.Root.Short(), tree.Short())
	}
}
