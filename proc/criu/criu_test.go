package criu

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func TestParseVersion(t *testing.T) {
	for in, want := range map[string]Version{"4.2.1": 40201, "4.2": 40200, "3.17.1": 31701} {
		if v, err := ParseVersion(in); err != nil || v != want || (len(in) > 3 && v.String() != in) {
			t.Errorf("ParseVersion(%q) = %v %v", in, v, err)
		}
	}
	for _, bad := range []string{"", "4", "4.x", "4.2.1.1", "4.200"} {
		if _, err := ParseVersion(bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ParseVersion(%q): %v", bad, err)
		}
	}
}

func TestCRIULogQuoting(t *testing.T) {
	log := `(00.000000) Version: 4.2.1
(00.028742) Error (criu/util.c:1533): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
(00.191056) Error (criu/sockets.c:628): sockets: Can't get 1:16 opt: Operation not supported
(00.191068) Error (criu/cr-dump.c:1681): Dump files (pid: 32315) failed with -1
`
	q := QuoteLines(ErrorLines(log))
	if strings.Contains(q, "RLIMIT_NOFILE") || !strings.Contains(q, "Can't get 1:16 opt") || !strings.Contains(q, "Dump files (pid: 32315)") {
		t.Errorf("quote %q", q)
	}
	// No error lines: the tail stands in.
	if q := QuoteLines(ErrorLines("a\nb\n")); q != "CRIU says: a | b" {
		t.Errorf("quote %q", q)
	}
}

// FuzzImageFiles feeds hostile image files (data from storage) to the
// decoder a restore runs before it stops anything.
func FuzzImageFiles(f *testing.F) {
	// IMG_COMMON magic, FILES magic, one entry of 2 bytes.
	f.Add([]byte{0x54, 0x56, 0x62, 0x54, 0x91, 0x16, 0x48, 0x56, 2, 0, 0, 0, 8, 1}, []byte{})
	f.Add([]byte{0x54, 0x56, 0x62, 0x54, 0x91, 0x16, 0x48, 0x56, 0xff, 0xff, 0xff, 0xff}, []byte{1, 2, 3, 4})
	f.Fuzz(func(t *testing.T, files, remaps []byte) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "files.img"), files, 0o600)
		if len(remaps) > 0 {
			os.WriteFile(filepath.Join(dir, "remap-fpath.img"), remaps, 0o600)
		}
		got, err := ImageFiles(dir)
		if err == nil {
			for _, f := range got {
				if !strings.HasPrefix(f.Path, "/") || PseudoFS(f.Path) {
					t.Fatalf("bad path %q", f.Path)
				}
			}
		}
	})
}
