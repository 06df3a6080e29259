package room

import (
	"errors"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

func TestRoomCheckFitsAndFull(t *testing.T) {
	dir := t.TempDir()
	if err := Check(dir, nil, 0, 0); err != nil {
		t.Fatalf("an empty write on a temp dir: %v", err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	free := AvailBytes(&fs)
	err := Check(dir, nil, free+1<<30, 0)
	if !errors.Is(err, errdefs.ErrNoSpace) {
		t.Fatalf("a write larger than the filesystem's free space: %v", err)
	}
	if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "df") {
		t.Fatalf("the error names neither the home nor df: %v", err)
	}
}

func TestRoomBytesIEC(t *testing.T) {
	for n, want := range map[uint64]string{12: "12 B", 2048: "2.0 KiB", 3 << 20: "3.0 MiB", 5 << 30: "5.0 GiB"} {
		if got := bytesIEC(n); got != want {
			t.Errorf("bytesIEC(%d) = %q, want %q", n, got, want)
		}
	}
}
