package engine

import (
	"context"
	"fmt"

	"github.com/turnsnap/turnsnap/engine/check"
)

// VerifyReport says what Verify read.
type VerifyReport = check.Report

// Verify reads every object checkpoint ref needs and checks every hash: the
// record against its id, each pack against its name, each pack header
// against the catalog's index, each blob's plaintext against its id, and each
// tree's canonical encoding (so the tree hashes are recomputed bottom up).
// It also checks that the files are restorable under the device-node rule
// restore applies (checkDevices). The first problem is returned as an error
// naming the object.
func (e *Engine) Verify(ctx context.Context, ref string) (*VerifyReport, error) {
	defer e.shared()()
	cp, err := e.resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	rep, err := e.checker().Verify(ctx, cp)
	if err != nil {
		return rep, err
	}
	if err := checkDevices(ctx, e.repo, cp.FSTree); err != nil {
		return rep, fmt.Errorf("checkpoint %s: files not restorable: %w", cp.ID.Short(), err)
	}
	return rep, nil
}

// checker checks this home's store against its catalog.
func (e *Engine) checker() *check.Checker {
	return &check.Checker{Store: e.store, Blobs: e.repo, Locator: check.CatalogLocator(e.cat)}
}
