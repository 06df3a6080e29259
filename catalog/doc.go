// Package catalog is turnsnap's local index of checkpoints, their lineage,
// sandboxes, refs (heads and tags), blob locations and object reference
// counts, kept in a Badger database in one directory.
//
// The catalog is an index and a cache, never the source of truth: every
// checkpoint record lives in the object store under its hash, and the catalog
// stores the very same bytes (EncodeRecord), re-checking the hash on every
// read (or finding them equal to bytes checked and decoded before:
// record_cache.go). Anything here can be rebuilt from the store, which is why Open
// refuses an unknown schema instead of migrating it.
//
// All reads and writes go through transactions: View for a consistent
// read-only snapshot, Update for an atomic, durable change (retried on
// conflict). Only bulk operations that may exceed one transaction, PutBlobs
// and AddRefCounts, live on Catalog itself; they are not atomic, and their
// doc comments say why that is safe.
//
// The write order for a new checkpoint is: upload chunks, packs and trees;
// PutBlobs and AddRefCounts (increments) for what it references; then one
// Update that calls PutCheckpoint and SetRef(RefHead). Deleting is the reverse:
// one Update with DeleteCheckpoint, then AddRefCounts with the decrements. A
// crash between steps leaves counts too high (a leak a later check can fix),
// never too low. A Group runs concurrent callers' Updates in one
// transaction (group commit: one fsync for all), each caller's writes
// still all or nothing.
//
// One process at a time may open a catalog directory; a second Open fails
// with errdefs.ErrUnavailable. The key schema is documented in keys.go.
package catalog
