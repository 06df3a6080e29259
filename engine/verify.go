package engine

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/rootfs"

	"github.com/turnsnap/turnsnap/engine/check"
)

// VerifyReport says what Verify read.
type VerifyReport = check.Report

// Verify reads every object checkpoint ref needs and checks every hash: the
// record against its id, each pack against its name, each pack header
// against the catalog's index, each blob's plaintext against its id, and each
// tree's canonical encoding (so the tree hashes are recomputed bottom up).
// It applies every rule a restore applies and re-hashes the base this host
// has materialised for the checkpoint. The first problem is returned as an
// error naming the object.
func (e *Engine) Verify(ctx context.Context, ref string) (*VerifyReport, error) {
	defer e.shared()()
	e.progressPhase("verify", 0)
	cp, err := e.resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	rep, err := e.checker().Verify(ctx, cp)
	if err != nil {
		return rep, err
	}
	if rep.BaseChecked, err = e.checkBase(ctx, cp.Sandbox, cp.Backend, cp.BaseTree, true); err != nil {
		return rep, fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
	}
	// Branches of cp stack on its frozen layer and read it as it is.
	for _, f := range implementing[rootfs.Freezer](e.backends) {
		checked, err := f.VerifyFrozen(ctx, cp.FSTree)
		rep.FrozenChecked = rep.FrozenChecked || checked
		if err != nil {
			return rep, fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
		}
	}
	return rep, nil
}

// baseChecker is a backend that keeps materialised bases on this host.
type baseChecker interface {
	CheckBase(ctx context.Context, tree delta.ID, full bool) (bool, error)
}

// checkBase re-hashes the base tree as this host has it for backend, and
// reports whether it had one. Restores pass full=false (a stat per entry),
// verify full=true.
func (e *Engine) checkBase(ctx context.Context, sandbox, backend string, tree delta.ID, full bool) (bool, error) {
	var cfg json.RawMessage
	e.view(ctx, func(tx *catalog.Tx) error {
		if sb, err := tx.Sandbox(sandbox); err == nil && sb.Backend == backend {
			cfg = sb.Config
		}
		return nil
	})
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

// checker checks this home's store against its catalog.
func (e *Engine) checker() *check.Checker {
	return &check.Checker{Store: e.store, Blobs: e.repo, Locator: check.CatalogLocator(e.cat), Keys: e.localKeys(), IDs: e.ids()}
}
