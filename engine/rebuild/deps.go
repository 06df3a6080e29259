package rebuild

import (
	"context"
	"log/slog"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/remote"
	"github.com/turnsnap/turnsnap/upload"
)

// Deps is what a Rebuilder needs of the engine. The catalog and stores are
// function values: a rebuild replaces the catalog (SetCatalog), and setting
// up a remote or keys replaces the stores.
type Deps struct {
	CatalogDir string
	// Exclusive holds the engine's maintenance lock until release: a
	// rebuild swaps the catalog under every operation.
	Exclusive func() (release func())
	// Phase names the long operation running, for progress reports.
	Phase func(name string)
	// RefuseIfEncrypted fails in a home whose key is not loaded.
	RefuseIfEncrypted func(ctx context.Context) error
	// CatalogOptions are the options a writable catalog opens with.
	CatalogOptions func() catalog.Options
	// Catalog is the live catalog, nil while it is swapped; SetCatalog
	// replaces it (the engine remakes its blob reader on the new one).
	Catalog    func() *catalog.Catalog
	SetCatalog func(*catalog.Catalog)
	// Stores are the engine's store (local in front of remote), the local
	// one and the remote one (nil without a remote).
	Stores func() (store, local, remote upload.Store)
	// Keys reads this home's sealed objects (nil in a plaintext home).
	Keys func() *delta.Keys
	// Blobs reads blobs at given locations (content.Repo).
	Blobs func() Locations
	// BlobsOf reads trees through another catalog's blob index.
	BlobsOf func(cat *catalog.Catalog) delta.BlobLoader
	// Syncer is the remote side as it is now, to backfill the upload queue.
	Syncer func() *remote.Syncer
	HomeID func() string
	Log    *slog.Logger
}

// Locations reads blobs at the locations given, not the catalog's.
type Locations interface {
	LoaderFor(locs map[delta.ID]catalog.BlobLocation) delta.BlobLoader
}

// Rebuilder rebuilds one home's catalog.
type Rebuilder struct{ d Deps }

// New makes a home's Rebuilder.
func New(d Deps) *Rebuilder { return &Rebuilder{d: d} }
