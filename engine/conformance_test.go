package engine

import (
	"context"
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
// the engine's own Backend seam. Both need root; btrfs also needs a
// loop-mounted filesystem, which btrfstest makes.

func TestConformanceOverlay(t *testing.T) {
	roottest.Run(t, func(t *testing.T) roottest.Setup {
		testenv.RequireRoot(t)
		return roottest.Setup{Backend: rtBackend{overlayBackend{overlay.NewBackend(filepath.Join(t.TempDir(), "bases"))}}}
	})
}

func TestConformanceBtrfs(t *testing.T) {
	roottest.Run(t, func(t *testing.T) roottest.Setup {
		pool := btrfstest.Pool(t)
		b, err := btrfs.NewBackend(pool, btrfs.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return roottest.Setup{
			Backend: rtBackend{btrfsBackend{b}},
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

// rtBackend converts an engine Backend to the suite's interface.
type rtBackend struct{ Backend }

func (b rtBackend) Create(ctx context.Context, dir, base string, tree delta.ID, loader delta.BlobLoader) (roottest.Root, error) {
	r, err := b.Backend.Create(ctx, dir, base, tree, loader)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (b rtBackend) Open(dir, base string) roottest.Root { return b.Backend.Open(dir, base) }
