package harness

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// A tar+zstd round trip of a tree (files, modes, a symlink, a fifo, an
// empty dir, mtimes) gives a tree of the same digest; any change to
// content, mode or mtime changes the digest.
func TestArchiveRoundTripDigest(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "app/sub"), 0o755)
	os.MkdirAll(filepath.Join(src, "empty"), 0o700)
	os.WriteFile(filepath.Join(src, "app/a.sh"), []byte("echo a\n"), 0o755)
	os.WriteFile(filepath.Join(src, "app/sub/b.txt"), make([]byte, 300000), 0o600)
	os.Symlink("a.sh", filepath.Join(src, "app/link"))
	if err := syscall.Mkfifo(filepath.Join(src, "app/fifo"), 0o640); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	os.Chtimes(filepath.Join(src, "app/a.sh"), old, old)
	want, err := TreeDigest(src)
	if err != nil {
		t.Fatal(err)
	}
	arch := filepath.Join(t.TempDir(), "root.tar.zst")
	if n, err := tarZstd(src, arch); err != nil || n <= 0 {
		t.Fatalf("tarZstd: %d %v", n, err)
	}
	dst := t.TempDir()
	if err := untarZstd(arch, dst); err != nil {
		t.Fatal(err)
	}
	if got, _ := TreeDigest(dst); got != want {
		t.Fatalf("digest after the round trip %s, before %s", got, want)
	}
	for name, change := range map[string]func(){
		"content": func() {
			os.WriteFile(filepath.Join(dst, "app/a.sh"), []byte("echo b\n"), 0o755)
			os.Chtimes(filepath.Join(dst, "app/a.sh"), old, old)
		},
		"mode":    func() { os.Chmod(filepath.Join(dst, "app/a.sh"), 0o700) },
		"mtime":   func() { os.Chtimes(filepath.Join(dst, "app/a.sh"), old, old.Add(time.Second)) },
		"deleted": func() { os.Remove(filepath.Join(dst, "app/link")) },
	} {
		change()
		if got, _ := TreeDigest(dst); got == want {
			t.Errorf("a %s change leaves the digest unchanged", name)
		}
		want, _ = TreeDigest(dst)
	}
}

func TestPercentile(t *testing.T) {
	v := []float64{5, 1, 4, 2, 3}
	if Percentile(v, 50) != 3 || Percentile(v, 100) != 5 || Percentile(v, 0) != 1 || Percentile(nil, 50) != 0 {
		t.Fatal("nearest-rank percentiles")
	}
}
