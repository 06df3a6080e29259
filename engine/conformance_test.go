package engine

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/btrfs"
	"github.com/turnsnap/turnsnap/internal/btrfstest"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/overlay"
)

// The sandbox-root conformance suite runs against every backend through
// rootfs.Backend, which both implement directly. Both need root; btrfs also needs a
// loop-mounted filesystem, which btrfstest makes.

func TestConformanceOverlay(t *testing.T) {
	roottest.Run(t, func(t *testing.T) roottest.Setup {
		testenv.RequireRoot(t)
		return roottest.Setup{Backend: overlay.NewBackend(filepath.Join(t.TempDir(), "bases"))}
	})
}

func TestConformanceBtrfs(t *testing.T) {
	roottest.Run(t, func(t *testing.T) roottest.Setup {
		pool := btrfstest.Pool(t)
		b, err := btrfs.NewBackend(btrfs.Options{Pool: pool})
		if err != nil {
			t.Fatal(err)
		}
		return roottest.Setup{
			Backend: b,
			Leftovers: func() ([]string, error) {
				entries, err := os.ReadDir(filepath.Join(pool, "sandboxes"))
				var left []string
				for _, e := range entries {
					left = append(left, e.Name())
				}
				if os.IsNotExist(err) {
					err = nil
				}
				return left, err
			},
		}
	})
}
