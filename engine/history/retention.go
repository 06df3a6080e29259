package history

import (
	"context"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/remote"
	"github.com/turnsnap/turnsnap/engine/retention"
)

// LoadHistory is what retention decides from (retention.Deps.LoadHistory):
// every checkpoint by sandbox, who owns each sandbox, and what this
// catalog pins.
func (v *Views) LoadHistory(ctx context.Context) (*retention.History, error) {
	h := retention.NewHistory()
	homeID := v.d.HomeID()
	err := v.d.View(ctx, func(tx *catalog.Tx) error {
		heads, err := tx.Refs(delta.RefHead)
		if err != nil {
			return err
		}
		for _, r := range heads {
			h.Pin.Add(r.Target, "head of "+r.Name)
		}
		tags, err := tx.Refs(delta.RefTag)
		if err != nil {
			return err
		}
		for _, r := range tags {
			h.Pin.Add(r.Target, "tag "+r.Name)
			h.Tags[r.Target] = append(h.Tags[r.Target], r.Name)
		}
		g, err := loadGraph(tx)
		if err != nil {
			return err
		}
		for id, labels := range g.meets {
			if cp := g.byID[id]; cp != nil {
				for _, l := range labels {
					if l != g.label(cp) {
						h.Pin.Add(id, "branched: "+l)
					}
				}
			}
		}
		for _, sb := range g.sandboxes {
			h.Known[string(sb.Key())] = true
			h.Names[string(sb.Key())], h.Keys[string(sb.Name)] = string(sb.Name), string(sb.Key())
			// The owner prunes: the creator, or the home that adopted it.
			o, err := remote.OwnerOf(tx, sb)
			if err != nil {
				return err
			}
			h.Owned[string(sb.Key())] = o.Home == "" || o.Home == homeID
		}
		removed, err := tx.RemovedOwnSandboxes()
		if err != nil {
			return err
		}
		for _, k := range removed {
			h.Owned[string(k)] = true
		}
		for _, cp := range g.byID {
			h.BySandbox[string(cp.SandboxKey())] = append(h.BySandbox[string(cp.SandboxKey())], cp)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return h, nil
}
