package check

import (
	"context"
	"fmt"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/upload"
)

// Repo is the content repository as Verifier reads it: blobs by the
// catalog's index, at locations given, and stored bytes decoded.
type Repo interface {
	Blobs
	LoaderFor(locs map[delta.ID]catalog.BlobLocation) delta.BlobLoader
}

// Deps is what a Verifier needs of the engine. Stores, catalog and keys
// are function values: the engine replaces them (setup, catalog rebuild).
type Deps struct {
	// Shared holds the engine's maintenance lock shared until release.
	Shared func() (release func())
	// Phase names the long operation running, for progress reports.
	Phase func(name string)
	// Resolve finds the checkpoint a user's reference names in the catalog.
	Resolve func(ctx context.Context, ref catalog.CheckpointRef) (*delta.Checkpoint, error)
	Store   func() upload.Store
	Catalog func() *catalog.Catalog
	Repo    func() Repo
	// Keys open this home's sealed packs; nil in a plaintext home.
	Keys   func() *delta.Keys
	IDs    func() delta.IDs
	HomeID func() string
	// CheckBase re-hashes the base tree this host has materialised for
	// checkpoint cp and reports whether it had one.
	CheckBase func(ctx context.Context, cp *delta.Checkpoint) (bool, error)
	// CheckFrozen re-hashes cp's frozen layer, if this host keeps one, and
	// reports whether it did; nil when no backend keeps any.
	CheckFrozen func(ctx context.Context, cp *delta.Checkpoint) (bool, error)
}

// Verifier verifies one home's checkpoints: against its catalog (Verify)
// or against its store alone (VerifyStore).
type Verifier struct{ d Deps }

// NewVerifier makes a home's Verifier.
func NewVerifier(d Deps) *Verifier { return &Verifier{d: d} }

// Verify reads every object checkpoint ref needs and checks every hash: the
// record against its id, each pack against its name, each pack header
// against the catalog's index, each blob's plaintext against its id, and each
// tree's canonical encoding (so the tree hashes are recomputed bottom up).
// It applies every rule a restore applies and re-hashes the base this host
// has materialised for the checkpoint. The first problem is returned as an
// error naming the object.
func (v *Verifier) Verify(ctx context.Context, ref catalog.CheckpointRef) (*Report, error) {
	defer v.d.Shared()()
	v.d.Phase("verify")
	cp, err := v.d.Resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	rep, err := v.Checker().Verify(ctx, cp)
	if err != nil {
		return rep, err
	}
	if rep.BaseChecked, err = v.d.CheckBase(ctx, cp); err != nil {
		return rep, fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
	}
	// Branches of cp stack on its frozen layer and read it as it is.
	if v.d.CheckFrozen != nil {
		if rep.FrozenChecked, err = v.d.CheckFrozen(ctx, cp); err != nil {
			return rep, fmt.Errorf("checkpoint %s: %w", cp.ID.Short(), err)
		}
	}
	return rep, nil
}

// Checker checks this home's store against its catalog.
func (v *Verifier) Checker() *Checker {
	return &Checker{Store: v.d.Store(), Blobs: v.d.Repo(), Locator: CatalogLocator(v.d.Catalog()), Keys: v.d.Keys(), IDs: v.d.IDs()}
}
