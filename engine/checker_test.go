package engine

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// TestCheckerCatchesAWrongRefcount: the oracle the engine tests end with
// must fail when a count drifts from what a rebuild would make.
func TestCheckerCatchesAWrongRefcount(t *testing.T) {
	ctx := context.Background()
	e := openEngineOracle(t, filepath.Join(t.TempDir(), "home"), false) // it breaks a count on purpose
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	agentTurn(t, cr.Root)
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	checkAll(t, e)
	cp, err := e.Resolve(ctx, mustRef(c1.ID.String()))
	must(t, err)
	must(t, e.cat.Update(ctx, func(tx *catalog.Tx) error { _, err := tx.AddRefCount(cp.FSTree, 1); return err }))
	err = e.Verifier().Checker().All(ctx, e.cat)
	if !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), cp.FSTree.String()) {
		t.Fatalf("checker after a refcount drift: %v, want ErrCorrupt naming %s", err, cp.FSTree.Short())
	}
}
