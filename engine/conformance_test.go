package engine

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/btrfs"
	"github.com/turnsnap/turnsnap/delta"
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

// The same suite with keyed content IDs (an encrypted home's): every scan,
// restore, compose and check of the backends must use the backend's
// scheme, or a tree fails to verify.
func TestConformanceOverlayKeyed(t *testing.T) {
	roottest.Run(t, func(t *testing.T) roottest.Setup {
		testenv.RequireRoot(t)
		ids := delta.NewDataKey().IDs()
		ob := overlay.NewBackend(filepath.Join(t.TempDir(), "bases"))
		ob.SetIDs(ids)
		return roottest.Setup{Backend: ob, IDs: ids}
	})
}

func TestConformanceBtrfs(t *testing.T) { conformanceBtrfs(t, delta.IDs{}) }

func TestConformanceBtrfsKeyed(t *testing.T) { conformanceBtrfs(t, delta.NewDataKey().IDs()) }

func conformanceBtrfs(t *testing.T, ids delta.IDs) {
	roottest.Run(t, func(t *testing.T) roottest.Setup {
		pool := btrfstest.Pool(t)
		b, err := btrfs.NewBackend(btrfs.Options{Pool: pool, IDs: ids})
		if err != nil {
			t.Fatal(err)
		}
		return roottest.Setup{
			IDs:     ids,
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
