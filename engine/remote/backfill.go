package remote

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/upload"
)

// BackfillBatch bounds the entries queued by one catalog transaction
// (Badger refuses a transaction past its size limit; a home with a long
// history queues tens of thousands of objects).
const BackfillBatch = 1000

// Backfill queues, in cat, every local object the remote store lacks and
// cat does not already queue: packs, then records, then the mutable
// objects. Each record waits for the packs it really needs (and for the
// earlier records it shares trees with, see needs); a head waits for its
// record. Every entry is accounted to the sandbox it belongs to (a pack to
// the first record that needs it), so `status` shows each sandbox's real
// share. The queue is written in batches; an interrupted backfill leaves
// a partial queue that the next one completes (it skips what is queued).
func (e *Syncer) Backfill(ctx context.Context, cat *catalog.Catalog) (int, int64, error) {
	have := map[string]bool{}
	if err := e.Remote.List(ctx, "", func(oi upload.ObjectInfo) error { have[oi.Name] = true; return nil }); err != nil {
		return 0, 0, fmt.Errorf("remote %s: %w", e.URL, err)
	}
	var queued map[string]bool
	labels := map[string]string{} // sandbox key → label
	err := cat.View(ctx, func(tx *catalog.Tx) error {
		var err error
		if queued, err = PendingNames(tx); err != nil {
			return err
		}
		sbs, err := tx.Sandboxes()
		for _, sb := range sbs {
			labels[string(sb.Key())] = string(sb.Name)
		}
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	var packs, records, others []catalog.PendingUpload
	size := map[string]int64{}
	err = e.Local.List(ctx, "", func(oi upload.ObjectInfo) error {
		if have[oi.Name] || queued[oi.Name] {
			return nil
		}
		p := catalog.PendingUpload{Sandbox: BackfillSandbox, Name: oi.Name, Size: oi.Size}
		size[oi.Name] = oi.Size
		switch {
		case strings.HasPrefix(oi.Name, delta.PackPrefix):
			packs = append(packs, p)
		case strings.HasPrefix(oi.Name, delta.RecordPrefix):
			records = append(records, p)
		default:
			others = append(others, p)
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	// What each record needs, in creation order so that a sandbox's first
	// record walks its base.
	type rec struct {
		p  catalog.PendingUpload
		cp *delta.Checkpoint
	}
	var recs []rec
	for _, p := range records {
		id, err := delta.ParseID(strings.TrimPrefix(p.Name, delta.RecordPrefix))
		if err != nil {
			others = append(others, p) // not a record of ours: it needs nothing
			continue
		}
		data, err := upload.ReadAll(ctx, e.Local, p.Name)
		if err != nil {
			return 0, 0, err
		}
		cp, err := delta.DecodeRecord(id, data)
		if err != nil {
			return 0, 0, fmt.Errorf("object %s: %w", p.Name, err)
		}
		p.Checkpoint = cp.ID
		if l, ok := labels[string(cp.SandboxKey())]; ok {
			p.Sandbox = l
		} else if delta.ValidRefName(string(cp.Sandbox)) {
			p.Sandbox = string(cp.Sandbox)
		}
		recs = append(recs, rec{p, cp})
	}
	slices.SortFunc(recs, func(a, b rec) int { return a.cp.Created.Compare(b.cp.Created) })
	packOwner := map[string]catalog.PendingUpload{} // pack → the record that first needs it
	n := newNeeds(cat, e.Blobs)
	byName := map[string]int{}
	for i := range recs {
		r := &recs[i]
		err := n.record(ctx, r.cp, func(pack string) {
			if _, missing := size[pack]; missing {
				r.p.After = append(r.p.After, pack)
				if _, ok := packOwner[pack]; !ok {
					packOwner[pack] = r.p
				}
			}
		}, func(other string) { r.p.After = append(r.p.After, other) })
		if err != nil {
			return 0, 0, err
		}
		slices.Sort(r.p.After)
		r.p.After = slices.Compact(r.p.After)
		byName[r.p.Name] = i
	}
	for i, p := range packs {
		if o, ok := packOwner[p.Name]; ok {
			packs[i].Sandbox, packs[i].Checkpoint = o.Sandbox, o.Checkpoint
		}
	}
	for i, p := range others {
		key, ok := strings.CutPrefix(p.Name, delta.SandboxPrefix)
		if !ok {
			key, ok = strings.CutPrefix(p.Name, delta.HeadPrefix)
			if ok {
				// A head goes up after the record it names.
				if data, err := upload.ReadAll(ctx, e.Local, p.Name); err == nil {
					if id, err := delta.ParseRef(data); err == nil {
						if _, pending := byName[delta.RecordName(id)]; pending {
							others[i].After = []string{delta.RecordName(id)}
						}
						others[i].Checkpoint = id
					}
				}
			}
		}
		if l, found := labels[key]; ok && found {
			others[i].Sandbox = l
		}
	}
	items := slices.Clone(packs)
	for _, r := range recs {
		items = append(items, r.p)
	}
	items = append(items, others...)
	var bytes int64
	for _, it := range items {
		bytes += it.Size
	}
	for rest := items; len(rest) > 0; {
		k := min(len(rest), BackfillBatch)
		if err := cat.Update(ctx, func(tx *catalog.Tx) error { return tx.EnqueueUploads(rest[:k]) }); err != nil {
			return 0, 0, err
		}
		rest = rest[k:]
	}
	return len(items), bytes, nil
}
