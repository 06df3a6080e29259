package remote

import (
	"context"
	"fmt"
	"strings"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/upload"
)

// Backfill queues, in cat, every local object the remote store lacks and
// cat does not already queue, in dependency tiers: every pack, then every
// record, then the mutable objects naming records.
func (e *Syncer) Backfill(ctx context.Context, cat *catalog.Catalog) (int, int64, error) {
	have := map[string]bool{}
	if err := e.Remote.List(ctx, "", func(oi upload.ObjectInfo) error { have[oi.Name] = true; return nil }); err != nil {
		return 0, 0, fmt.Errorf("remote %s: %w", e.URL, err)
	}
	var queued map[string]bool
	err := cat.View(ctx, func(tx *catalog.Tx) error {
		var err error
		queued, err = PendingNames(tx)
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	var tiers [3][]catalog.PendingUpload
	var n int
	var bytes int64
	err = e.Local.List(ctx, "", func(oi upload.ObjectInfo) error {
		if have[oi.Name] || queued[oi.Name] {
			return nil
		}
		tier := 2
		switch {
		case strings.HasPrefix(oi.Name, delta.PackPrefix):
			tier = 0
		case strings.HasPrefix(oi.Name, delta.RecordPrefix):
			tier = 1
		}
		tiers[tier] = append(tiers[tier], catalog.PendingUpload{Sandbox: BackfillSandbox, Name: oi.Name, Size: oi.Size})
		n++
		bytes += oi.Size
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	var items []catalog.PendingUpload
	for i := range tiers {
		var after []string
		if i > 0 {
			for _, p := range tiers[i-1] {
				after = append(after, p.Name)
			}
		}
		for _, p := range tiers[i] {
			p.After = after
			items = append(items, p)
		}
	}
	return n, bytes, cat.Update(ctx, func(tx *catalog.Tx) error { return tx.EnqueueUploads(items) })
}
