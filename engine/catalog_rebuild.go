package engine

import (
	"context"
	"log/slog"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/content"
	"github.com/turnsnap/turnsnap/engine/rebuild"
	"github.com/turnsnap/turnsnap/engine/remote"
	"github.com/turnsnap/turnsnap/upload"
)

// A catalog rebuild is package rebuild's Rebuilder (Engine.Rebuilder);
// these are its types as the engine's callers name them.
type (
	RebuildReport  = rebuild.Report
	RebuildOptions = rebuild.Options
	SkippedObject  = rebuild.SkippedObject
	SkipClass      = rebuild.SkipClass
	CorruptObject  = rebuild.CorruptObject
)

// The classes of object a rebuild leaves out (rebuild.SkipClass).
const (
	SkipDangling       = rebuild.SkipDangling
	SkipMissingObjects = rebuild.SkipMissingObjects
	SkipCorrupt        = rebuild.SkipCorrupt
)

// Rebuilder rebuilds this home's catalog from its object store.
func (e *Engine) Rebuilder() *rebuild.Rebuilder { return newRebuilder(e, e.log) }

// newRebuilder makes this home's Rebuilder. A rebuild replaces the
// catalog; the engine's blob reader follows it.
func newRebuilder(e *Engine, log *slog.Logger) *rebuild.Rebuilder {
	return rebuild.New(rebuild.Deps{
		CatalogDir:        e.home.catalogDir(),
		Exclusive:         e.exclusive,
		Phase:             func(name string) { e.progressPhase(name, 0) },
		RefuseIfEncrypted: func(ctx context.Context) error { return e.keys.RefuseIfEncrypted(ctx) },
		CatalogOptions:    func() catalog.Options { return catalogOptions(log, e.keys, false) },
		Catalog:           func() *catalog.Catalog { return e.cat },
		SetCatalog: func(c *catalog.Catalog) {
			if e.cat = c; c != nil {
				e.data.repo = newRepo(e)
			}
		},
		Stores: func() (upload.Store, upload.Store, upload.Store) {
			return e.stores.front, e.stores.local, e.stores.remote
		},
		Keys:  func() *delta.Keys { return e.keys.LocalKeys() },
		Blobs: func() rebuild.Locations { return e.data.repo },
		BlobsOf: func(cat *catalog.Catalog) delta.BlobLoader {
			return content.NewSealedIDs(e.stores.front, cat, e.data.codec, e.data.meter, e.keys.LocalKeys(), e.keys.IDs())
		},
		Syncer: func() *remote.Syncer { return e.rem.Syncer() },
		HomeID: func() string { return e.config.HomeID },
		Log:    log,
	})
}
