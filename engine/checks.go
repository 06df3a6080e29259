package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/check"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"github.com/turnsnap/turnsnap/upload"
)

// Verifying is package check's Verifier (Engine.Verifier); these are its
// reports as the engine's callers name them.
type (
	VerifyReport = check.Report
	StoreReport  = check.StoreReport
)

// Verifier verifies this home's checkpoints, against the catalog or the
// store alone.
func (e *Engine) Verifier() *check.Verifier { return newVerifier(e) }

// newVerifier makes this home's Verifier.
func newVerifier(e *Engine) *check.Verifier {
	return check.NewVerifier(check.Deps{
		Shared:  e.shared,
		Phase:   func(name string) { e.progressPhase(name, 0) },
		Resolve: e.Resolve,
		Store:   func() upload.Store { return e.stores.front },
		Catalog: func() *catalog.Catalog { return e.cat },
		Repo:    func() check.Repo { return e.data.repo },
		Keys:    func() *delta.Keys { return e.keys.LocalKeys() },
		IDs:     func() delta.IDs { return e.keys.IDs() },
		HomeID:  func() string { return e.config.HomeID },
		CheckBase: func(ctx context.Context, cp *delta.Checkpoint) (bool, error) {
			return e.checkBase(ctx, string(cp.Sandbox), cp.Backend, cp.BaseTree, true)
		},
		CheckFrozen: func(ctx context.Context, cp *delta.Checkpoint) (bool, error) {
			// Branches of cp stack on its frozen layer and read it as it is.
			checked := false
			for _, f := range implementing[rootfs.Freezer](e.backends) {
				ok, err := f.VerifyFrozen(ctx, cp.FSTree)
				if checked = checked || ok; err != nil {
					return checked, err
				}
			}
			return checked, nil
		},
	})
}

// baseChecker is a backend that keeps materialised bases on this host.
type baseChecker interface {
	CheckBase(ctx context.Context, tree delta.ID, full bool) (bool, error)
}

// checkBase re-hashes the base tree as this host has it for backend, and
// reports whether it had one. Restores pass full=false (a stat per entry),
// verify full=true.
func (e *Engine) checkBase(ctx context.Context, sandbox, backend string, tree delta.ID, full bool) (bool, error) {
	// The sandbox's own backend options, if it still exists (a checkpoint
	// outlives its sandbox); a catalog that cannot be read is an error.
	var cfg json.RawMessage
	err := e.view(ctx, func(tx *catalog.Tx) error {
		sb, err := tx.Sandbox(delta.SandboxName(sandbox))
		if err == nil && sb.Backend == backend {
			cfg = sb.Config
		}
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		return err
	})
	if err != nil {
		return false, fmt.Errorf("sandbox %s: %w", sandbox, err)
	}
	be, err := e.backend(backend, cfg)
	if err != nil {
		return false, nil // a backend this host cannot run has no base here
	}
	return checkBaseOn(ctx, be, tree, full)
}

func checkBaseOn(ctx context.Context, be any, tree delta.ID, full bool) (bool, error) {
	bc, ok := be.(baseChecker)
	if !ok {
		return false, nil
	}
	return bc.CheckBase(ctx, tree, full)
}
