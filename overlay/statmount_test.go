package overlay

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/mounts"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// TestCheckMountedByStatmount: statmount tells a root's overlay as the
// mount table does (point, type, super options, byte for byte), so
// checkMounted by it passes and fails exactly where the table's check
// does: the right layers pass, other layers fail, a directory inside the
// mount and an unmounted root are not mounted.
func TestCheckMountedByStatmount(t *testing.T) {
	r, _, _ := newRoot(t, func(lower string) {
		roottest.Write(t, filepath.Join(lower, "d", "f"), "base\n")
	})
	m, err := mounts.SuperOptions(r.Path())
	if errors.Is(err, mounts.ErrNoStatmount) {
		testenv.Missing(t, "statmount(2) with mount options (Linux 6.11)", "checkMounted reads the mount table on "+kernelRelease())
	}
	must(t, err)
	table := rootMount(t, r)
	if m.Point != table.Mountpoint || m.FSType != table.FSType || m.VFSOptions != table.VFSOptions {
		t.Fatalf("statmount: %q %q %q\nmountinfo: %q %q %q", m.Point, m.FSType, m.VFSOptions, table.Mountpoint, table.FSType, table.VFSOptions)
	}
	for _, tc := range []struct {
		what, path, layers string
		ok                 bool
	}{
		{"the root", r.Path(), hiddenLayers, true},
		{"other layers", r.Path(), "lowerdir=/elsewhere,upperdir=/upper,workdir=/work", false},
		{"a directory inside the mount", filepath.Join(r.Path(), "d"), hiddenLayers, false},
	} {
		byStat, byTable := checkMounted(tc.path, tc.layers), checkMountedTable(tc.path, tc.layers)
		if (byStat == nil) != tc.ok || (byTable == nil) != tc.ok {
			t.Errorf("%s: statmount says %v, the mount table %v; want ok=%v", tc.what, byStat, byTable, tc.ok)
		}
		if !tc.ok && (!errors.Is(byStat, errdefs.ErrPrecondition) || !errors.Is(byTable, errdefs.ErrPrecondition)) {
			t.Errorf("%s: %v / %v, want ErrPrecondition", tc.what, byStat, byTable)
		}
	}
	must(t, r.Unmount(context.Background()))
	if _, err := os.Stat(r.Path()); err != nil {
		t.Fatal(err)
	}
	if err := checkMounted(r.Path(), hiddenLayers); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("an unmounted root: %v, want ErrPrecondition", err)
	}
}
