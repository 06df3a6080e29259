package fstree

import (
	"bytes"
	"context"
	"github.com/turnsnap/turnsnap/delta"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// mkdirChain creates the directories parts below root one component at a
// time (the only way to make a path longer than PATH_MAX) and writes a file
// named leaf with content at the bottom. It returns the path of the file
// and the open bottom directory, closed at cleanup.
func mkdirChain(t *testing.T, root string, parts []string, leaf, content string) (string, int) {
	t.Helper()
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	for _, p := range parts {
		if err := unix.Mkdirat(fd, p, 0o755); err != nil && err != unix.EEXIST {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		must(t, err)
		unix.Close(fd)
		fd = next
	}
	t.Cleanup(func() { unix.Close(fd) })
	ffd, err := unix.Openat(fd, leaf, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644)
	must(t, err)
	_, err = unix.Write(ffd, []byte(content))
	must(t, err)
	unix.Close(ffd)
	return strings.Join(append(parts, leaf), "/"), fd
}

// longParts returns n directory names of 250 bytes: 16 of them make an
// in-sandbox path of about 4,090 bytes with a short leaf.
func longParts(prefix string, n int) []string {
	var out []string
	for i := range n {
		out = append(out, prefix+strings.Repeat(string(rune('a'+i%26)), 250-len(prefix)))
	}
	return out
}

// TestLongPathsRoundTrip scans, materialises and applies a tree with a
// path of about 4,090 bytes (legal inside a sandbox, too long for any host
// path that adds a prefix) and one of about 5,000 (longer than one path
// argument may be), the second a hardlink to the first.
func TestLongPathsRoundTrip(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	src := t.TempDir()
	deep, deepFD := mkdirChain(t, src, longParts("a", 20), "g", "deeper than PATH_MAX")
	p4090, fd4090 := mkdirChain(t, src, longParts("b", 16), strings.Repeat("f", 70), "at 4090 bytes")
	if len(p4090) < 4080 || len(p4090) >= 4096 || len(deep) < 5000 {
		t.Fatalf("test paths are %d and %d bytes", len(p4090), len(deep))
	}
	must(t, unix.Linkat(deepFD, "g", fd4090, "link", 0))
	mem := newMem()
	r1, err := Scan(ctx, src, ScanOptions{Saver: mem})
	if err != nil {
		t.Fatalf("scan of a tree with a %d-byte path: %v", len(deep), err)
	}
	if r1.Stats.FilesRead != 2 {
		t.Fatalf("scan read %d files, want 2", r1.Stats.FilesRead)
	}
	dst := t.TempDir()
	if _, err := Materialise(ctx, r1.Root, dst, ApplyOptions{Loader: mem}); err != nil {
		t.Fatalf("materialise: %v", err)
	}
	r2, err := Scan(ctx, dst, ScanOptions{})
	must(t, err)
	if r2.Root != r1.Root {
		t.Fatalf("materialised copy hashes to %s, source %s", r2.Root.Short(), r1.Root.Short())
	}
	// Applied as a layer onto a tree that already holds part of a chain.
	dst2 := t.TempDir()
	mkdirChain(t, dst2, longParts("b", 8), "old", "kept: the layer merges")
	if _, err := ApplyLayer(ctx, r1.Root, dst2, ApplyOptions{Loader: mem}); err != nil {
		t.Fatalf("apply layer: %v", err)
	}
	r3, err := Scan(ctx, dst2, ScanOptions{})
	must(t, err)
	if r3.Stats.Entries != r1.Stats.Entries+1 || r3.Stats.FilesRead != 3 {
		t.Fatalf("applied layer has %d entries and %d files, want %d and 3", r3.Stats.Entries, r3.Stats.FilesRead, r1.Stats.Entries+1)
	}
}

// hostSecret makes a host directory outside the scanned tree holding a
// file whose content must never reach a checkpoint.
func hostSecret(t *testing.T) (string, []byte) {
	t.Helper()
	dir := t.TempDir()
	secret := []byte("HOST SECRET " + strings.Repeat("s", 100))
	must(t, os.WriteFile(filepath.Join(dir, "passwd"), secret, 0o644))
	return dir, secret
}

// holds reports whether any stored blob contains needle.
func (s *memBlobs) holds(needle []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.m {
		if bytes.Contains(d, needle) {
			return true
		}
	}
	return false
}

// TestScanNeverFollowsSwappedNames swaps, between the scan's stat of a name
// and its open, a directory for a symlink to a host directory and a file
// for a symlink to a host file (the hook makes the race deterministic).
// The scan must record the symlinks and no byte of the host files.
func TestScanNeverFollowsSwappedNames(t *testing.T) {
	ctx := context.Background()
	host, secret := hostSecret(t)
	src := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(src, "d/sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "d/sub/f"), []byte("sandbox"), 0o644))
	must(t, os.WriteFile(filepath.Join(src, "file"), []byte("sandbox file"), 0o644))
	swapped := map[string]bool{}
	swap := func(rel, target string) {
		p := filepath.Join(src, rel)
		must(t, os.Rename(p, p+".old"))
		must(t, os.Symlink(target, p))
	}
	mem := newMem()
	opts := ScanOptions{Saver: mem, beforeOpen: func(rel string) {
		if swapped[rel] {
			return
		}
		switch rel {
		case "d/sub":
			swapped[rel] = true
			swap(rel, host) // below a directory already open
		case "d":
			swapped[rel] = true
			swap(rel, host)
		case "file":
			swapped[rel] = true
			swap(rel, filepath.Join(host, "passwd"))
		}
	}}
	res, err := Scan(ctx, src, opts)
	must(t, err)
	if mem.holds(secret) {
		t.Fatal("a host file's content reached the scanned tree")
	}
	if !swapped["d"] || !swapped["file"] {
		t.Fatalf("the hook did not run for every name: %v", swapped)
	}
	root, err := delta.LoadTree(ctx, mem, res.Root)
	must(t, err)
	for _, name := range []string{"d", "file"} {
		if e := root.Find(name); e == nil || e.Type != delta.TypeSymlink {
			t.Errorf("swapped name %s recorded as %+v, want the symlink", name, e)
		}
	}
}

// TestScanRacingSwapperNeverLeaks runs scans while a writer keeps swapping
// a directory for a symlink to a host directory and back, and asserts no
// scan ever stores host content.
func TestScanRacingSwapperNeverLeaks(t *testing.T) {
	ctx := context.Background()
	host, secret := hostSecret(t)
	src := t.TempDir()
	for _, d := range []string{"a", "b"} {
		must(t, os.MkdirAll(filepath.Join(src, d, "x"), 0o755))
		must(t, os.WriteFile(filepath.Join(src, d, "x/passwd"), []byte("sandbox "+d), 0o644))
	}
	must(t, os.Symlink(host, filepath.Join(src, "link")))
	var stop atomic.Bool
	var wg sync.WaitGroup
	var swaps atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			d := filepath.Join(src, []string{"a", "b"}[i%2])
			// a/x and the link trade places: x is a directory one moment
			// and a symlink to the host directory the next.
			if err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(src, "link"), unix.AT_FDCWD, filepath.Join(d, "x"), unix.RENAME_EXCHANGE); err != nil {
				t.Error(err)
				return
			}
			swaps.Add(1)
		}
	}()
	mem := newMem()
	iterations := 300
	if testing.Short() {
		iterations = 50
	}
	for range iterations {
		if _, err := Scan(ctx, src, ScanOptions{Saver: mem}); err != nil && !strings.Contains(err.Error(), "kept changing") {
			stop.Store(true)
			wg.Wait()
			t.Fatal(err)
		}
		if mem.holds(secret) {
			stop.Store(true)
			wg.Wait()
			t.Fatal("a scan racing a symlink swap stored a host file's content")
		}
	}
	stop.Store(true)
	wg.Wait()
	if swaps.Load() < int64(iterations) {
		t.Logf("only %d swaps during %d scans", swaps.Load(), iterations)
	}
}
