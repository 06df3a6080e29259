package bench

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// digest hashes every name, type, mode, symlink target and content below
// dir, in walk order: two equal digests are two equal trees.
func digest(t *testing.T, dir string) [32]byte {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(h, "%s %v\n", rel, info.Mode())
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "-> %s\n", target)
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(data)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

func project(t *testing.T, seed int64) string {
	t.Helper()
	dir := t.TempDir()
	if err := WriteProject(dir, seed); err != nil {
		t.Fatalf("WriteProject(seed %d): %v", seed, err)
	}
	return dir
}

// The demo and the benchmarks compare runs: the same seed must give the
// same project, byte for byte, and another seed another one.
func TestWriteProjectDeterministic(t *testing.T) {
	a, b, c := project(t, 1), project(t, 1), project(t, 2)
	if digest(t, a) != digest(t, b) {
		t.Fatal("two projects of seed 1 differ")
	}
	if digest(t, a) == digest(t, c) {
		t.Fatal("seeds 1 and 2 give the same project")
	}
	// The shape the demo relies on.
	for _, rel := range []string{"README.md", "src/main.go", "src/pkg19/code.go", "data/config.json", "assets/logo.bin"} {
		if _, err := os.Stat(filepath.Join(a, rel)); err != nil {
			t.Errorf("project lacks %s: %v", rel, err)
		}
	}
	if info, err := os.Stat(filepath.Join(a, "assets/logo.bin")); err != nil || info.Size() != 512<<10 {
		t.Errorf("assets/logo.bin: %v, want 512 KiB", err)
	}
	if data, err := os.ReadFile(filepath.Join(a, "src/pkg00/code.go")); err != nil || len(data) != 4096 {
		t.Errorf("src/pkg00/code.go: %d bytes (%v), want 4096", len(data), err)
	}
	if info, err := os.Stat(filepath.Join(a, "tmp")); err != nil || !info.IsDir() {
		t.Errorf("tmp/ is not a directory: %v", err)
	}
}

// addBusybox copies the host's busybox with its applets when there is one,
// and adds nothing otherwise.
func TestAddBusybox(t *testing.T) {
	dir := t.TempDir()
	if err := addBusybox(dir); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("/bin/busybox")
	if err != nil {
		if _, err := os.Lstat(filepath.Join(dir, "bin")); err == nil {
			t.Fatal("no /bin/busybox on this host, yet bin/ was made")
		}
		return
	}
	got, err := os.ReadFile(filepath.Join(dir, "bin/busybox"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("bin/busybox is not the host's busybox (%v)", err)
	}
	for _, applet := range []string{"sh", "httpd", "sleep"} {
		if target, err := os.Readlink(filepath.Join(dir, "bin", applet)); err != nil || target != "busybox" {
			t.Errorf("bin/%s -> %q (%v), want busybox", applet, target, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "www/index.html")); err != nil {
		t.Errorf("no web root: %v", err)
	}
}

// TextLike stands in for source code in the benchmarks, so it must be
// exactly as long as asked and compress like code does: zstd shrinks Go
// source about 3 to 5 times; random bytes (1x) or a repeated word (100x+)
// would make every dedup and compression number meaningless.
func TestTextLike(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	for _, n := range []int{0, 1, 100, 4096, 1 << 20} {
		if got := len(TextLike(rng, n)); got != n {
			t.Errorf("TextLike(%d) is %d bytes", n, got)
		}
	}
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	text := TextLike(rng, 1<<20)
	ratio := float64(len(text)) / float64(len(enc.EncodeAll(text, nil)))
	t.Logf("zstd ratio of 1 MiB of TextLike: %.2f", ratio)
	if ratio < 2 || ratio > 8 {
		t.Errorf("TextLike compresses %.2fx with zstd, want 2x to 8x, like source code", ratio)
	}
	if bytes.Equal(TextLike(rand.New(rand.NewSource(1)), 4096), TextLike(rand.New(rand.NewSource(2)), 4096)) {
		t.Error("TextLike ignores its generator")
	}
}
