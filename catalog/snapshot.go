package catalog

import (
	"context"
	"fmt"
	"sync"

	"github.com/dgraph-io/badger/v4"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Snapshot is a read-only transaction kept open across calls, for a
// caller that looks up many keys one at a time (a checkpoint's dedup of
// each blob it saves). Badger makes every new transaction wait until the
// writes committed before it are applied, fsync included: on a busy daemon
// a View per lookup waited for other turns' commits dozens of times per
// turn. A Snapshot waits once. It sees the catalog as of its start, so it
// suits only lookups whose staleness is safe (a blob indexed since is
// stored twice and settled when the second copy is indexed: content's
// dedup rule). It is safe for concurrent use; Close releases it.
type Snapshot struct {
	mu  sync.Mutex
	c   *Catalog
	txn *badger.Txn
}

// Snapshot starts a Snapshot.
func (c *Catalog) Snapshot(ctx context.Context) (*Snapshot, error) {
	if err := c.ready(ctx); err != nil {
		return nil, err
	}
	return &Snapshot{c: c, txn: c.db.NewTransaction(false)}, nil
}

// View runs fn on the snapshot. The Tx is valid only until fn returns.
func (s *Snapshot) View(ctx context.Context, fn func(tx *Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.txn == nil {
		return fmt.Errorf("catalog %s: snapshot closed: %w", s.c.dir, errdefs.ErrPrecondition)
	}
	return fn(&Tx{ctx: ctx, txn: s.txn, records: &s.c.records})
}

// Close releases the snapshot; calling it again does nothing.
func (s *Snapshot) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.txn != nil {
		s.txn.Discard()
		s.txn = nil
	}
}
