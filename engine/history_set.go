package engine

import (
	"context"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/remote"
)

// history is what prune and forget decide from: every checkpoint by
// sandbox, which sandboxes this home may prune, and what is pinned.
type history struct {
	pin       pinned                         // heads, tags, branch points: never deleted
	tags      map[delta.ID][]string          // checkpoint -> its tags
	owned     map[string]bool                // sandbox keys whose checkpoints this home may delete
	known     map[string]bool                // every sandbox key the catalog has
	names     map[string]string              // sandbox key -> live label
	keys      map[string]string              // live label -> sandbox key
	bySandbox map[string][]*delta.Checkpoint // sandbox key -> its checkpoints
}

// mayPrune reports whether this home may delete the checkpoints of the
// sandbox with this key: one it created (live or removed since), or a
// legacy one. Another home's sandbox, and records of an id'd sandbox this
// catalog does not know, are left alone.
func (h *history) mayPrune(key string) bool {
	cps := h.bySandbox[key]
	return h.owned[key] || (!h.known[key] && (len(cps) == 0 || cps[0].SandboxID == ""))
}

func (h *history) label(cp *delta.Checkpoint) string {
	if n, ok := h.names[cp.SandboxKey()]; ok {
		return n
	}
	return cp.Sandbox
}

func (e *Engine) loadHistory(ctx context.Context) (*history, error) {
	h := &history{pin: pinned{}, tags: map[delta.ID][]string{}, owned: map[string]bool{}, known: map[string]bool{},
		names: map[string]string{}, keys: map[string]string{}, bySandbox: map[string][]*delta.Checkpoint{}}
	err := e.view(ctx, func(tx *catalog.Tx) error {
		heads, err := tx.Refs(delta.RefHead)
		if err != nil {
			return err
		}
		for _, r := range heads {
			h.pin.add(r.Target, "head of "+r.Name)
		}
		tags, err := tx.Refs(delta.RefTag)
		if err != nil {
			return err
		}
		for _, r := range tags {
			h.pin.add(r.Target, "tag "+r.Name)
			h.tags[r.Target] = append(h.tags[r.Target], r.Name)
		}
		g, err := loadGraph(tx)
		if err != nil {
			return err
		}
		for id, labels := range g.meets {
			if cp := g.byID[id]; cp != nil {
				for _, l := range labels {
					if l != g.label(cp) {
						h.pin.add(id, "branched: "+l)
					}
				}
			}
		}
		for _, sb := range g.sandboxes {
			h.known[sb.Key()] = true
			h.names[sb.Key()], h.keys[sb.Name] = sb.Name, sb.Key()
			// The owner prunes: the creator, or the home that adopted it.
			o, err := remote.OwnerOf(tx, sb)
			if err != nil {
				return err
			}
			h.owned[sb.Key()] = o.Home == "" || o.Home == e.config.HomeID
		}
		removed, err := tx.RemovedOwnSandboxes()
		if err != nil {
			return err
		}
		for _, k := range removed {
			h.owned[k] = true
		}
		for _, cp := range g.byID {
			h.bySandbox[cp.SandboxKey()] = append(h.bySandbox[cp.SandboxKey()], cp)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return h, nil
}
