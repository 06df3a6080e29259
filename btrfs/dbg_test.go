package btrfs

import (
	"context"
	"encoding/binary"
	"fmt"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/turnsnap/turnsnap/internal/btrfstest"
)

func TestDbgCosts(t *testing.T) {
	pool := btrfstest.Pool(t)
	sv := filepath.Join(pool, "sv")
	must(t, createSubvolume(sv))
	for i := range 100 {
		os.WriteFile(filepath.Join(sv, "f"+string(rune('a'+i%26))+string(rune('a'+i/26))), []byte("x"), 0o644)
	}
	must(t, syncFS(sv))
	tm := func(name string, fn func() error) {
		start := time.Now()
		for range 10 {
			must(t, fn())
		}
		t.Logf("%-28s %v", name, time.Since(start)/10)
	}
	i := 0
	tm("syncFS idle", func() error { return syncFS(sv) })
	tm("startSync idle", func() error { return startSync(sv) })
	tm("write+syncFS", func() error { os.WriteFile(filepath.Join(sv, "w"), []byte("y"), 0o644); return syncFS(sv) })
	tm("write+startSync", func() error { os.WriteFile(filepath.Join(sv, "w"), []byte("y"), 0o644); return startSync(sv) })
	tm("snapshot ro", func() error { i++; return snapshot(sv, filepath.Join(pool, "s"+string(rune('a'+i))), true) })
	tm("snapshot rw", func() error { i++; return snapshot(sv, filepath.Join(pool, "s"+string(rune('a'+i))), false) })
	j := 0
	tm("delete", func() error { j++; return deleteSubvolume(filepath.Join(pool, "s"+string(rune('a'+j)))) })
	tm("writeFile", func() error { return writeFile(filepath.Join(sv, "meta"), []byte("hello")) })
	tm("anyChanged", func() error { _, err := anyChanged(sv, 1<<40); return err })
}

func TestDbgScanCost(t *testing.T) {
	pool := btrfstest.Pool(t)
	b, _ := NewBackend(pool, Options{})
	ctx := context.Background()
	store := roottest.NewMemStore()
	base := t.TempDir()
	for i := range 500 {
		p := filepath.Join(base, fmt.Sprintf("d%02d/f%03d", i/50, i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(fmt.Sprint("content", i)), 0o644)
	}
	res, _ := delta.Scan(ctx, base, delta.ScanOptions{Saver: store})
	lower, err := b.PrepareBase(ctx, res.Root, store)
	must(t, err)
	r, err := b.Create(ctx, filepath.Join(t.TempDir(), "sb"), lower, delta.EmptyTree(), store)
	must(t, err)
	defer r.Remove(ctx)
	for round := range 5 {
		for i := range 10 {
			os.WriteFile(filepath.Join(r.Path(), fmt.Sprintf("d%02d/f%03d", i*5, i*50+round)), []byte(fmt.Sprint("x", round)), 0o644)
		}
		t0 := time.Now()
		res, err := r.Scan(ctx, store)
		must(t, err)
		t1 := time.Now()
		must(t, r.Committed(res))
		t2 := time.Now()
		res2, _ := r.Scan(ctx, store)
		t3 := time.Now()
		live, baseRoot, baseGen := r.internals(t)
		must(t, syncFS(live))
		want, _, _ := oracle(t, r.Path(), baseRoot, baseGen)
		t.Logf("match oracle: %v", want == res.Root)
		t.Logf("scan %v committed %v noop %v (entries %d read %d, noop entries %d)", t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), res.Stats.Entries, res.Stats.FilesRead, res2.Stats.Entries)
	}
}

func TestDbgNoop(t *testing.T) {
	pool := btrfstest.Pool(t)
	b, _ := NewBackend(pool, Options{})
	ctx := context.Background()
	store := roottest.NewMemStore()
	base := t.TempDir()
	for i := range 500 {
		p := filepath.Join(base, fmt.Sprintf("d%02d/f%03d", i/50, i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(fmt.Sprint("content", i)), 0o644)
	}
	res, _ := delta.Scan(ctx, base, delta.ScanOptions{Saver: store})
	lower, _ := b.PrepareBase(ctx, res.Root, store)
	r, _ := b.Create(ctx, filepath.Join(t.TempDir(), "sb"), lower, delta.EmptyTree(), store)
	defer r.Remove(ctx)
	os.WriteFile(filepath.Join(r.Path(), "d01/new"), []byte("x"), 0o644)
	res, _ = r.Scan(ctx, store)
	must(t, r.Committed(res))
	for range 3 {
		t0 := time.Now()
		sbDir, g, _ := r.gen()
		t1 := time.Now()
		base, bi, _ := r.baseDir(sbDir)
		t2 := time.Now()
		live, meta := filepath.Join(g, "live"), metaDir(filepath.Join(g, "meta"))
		h, _ := r.loadHead(live, meta, base, bi)
		t3 := time.Now()
		syncFS(live)
		t4 := time.Now()
		anyChanged(live, h.Gen)
		t5 := time.Now()
		t.Logf("gen %v base %v head %v sync %v search %v", t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), t4.Sub(t3), t5.Sub(t4))
	}
}

func TestDbgGen(t *testing.T) {
	pool := btrfstest.Pool(t)
	sv := filepath.Join(pool, "sv")
	must(t, createSubvolume(sv))
	os.WriteFile(filepath.Join(sv, "f"), []byte("x"), 0o644)
	must(t, snapshot(sv, filepath.Join(pool, "ro"), true))
	show := func(tag string) {
		var buf [subvolInfoLen]byte
		withDir(filepath.Join(pool, "ro"), func(fd int) error { return ioctl(fd, iocGetSubvolInfo, unsafe.Pointer(&buf[0])) })
		ne := binary.NativeEndian
		t.Logf("%s: gen %d ctransid %d otransid %d", tag, ne.Uint64(buf[280:]), ne.Uint64(buf[344:]), ne.Uint64(buf[352:]))
	}
	show("created")
	must(t, snapshot(filepath.Join(pool, "ro"), filepath.Join(pool, "rw"), false))
	syncFS(sv)
	show("after snapshot of it")
	must(t, setReadOnly(filepath.Join(pool, "ro"), false))
	os.WriteFile(filepath.Join(pool, "ro", "g"), []byte("x"), 0o644)
	syncFS(sv)
	show("after flip+write")
}
