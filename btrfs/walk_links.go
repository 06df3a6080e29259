package btrfs

import (
	"fmt"
	"slices"
	"strings"
)

// affectedLinks grows the dirty set by every name of a multi-link inode of
// the previous layer that lies below a directory that moved or left: its
// hardlink entries name paths that may have changed.
func (w *walker) affectedLinks() error {
	if len(w.p.gone) == 0 && len(w.p.moved) == 0 {
		return nil
	}
	prefixes := slices.Clone(w.p.moved)
	for _, p := range w.p.gone {
		prefixes = append(prefixes, p)
	}
	links, err := w.prevLinks()
	if err != nil {
		return err
	}
	for ino, ps := range links {
		if w.p.multi[ino] {
			continue
		}
		for _, p := range ps {
			if slices.ContainsFunc(prefixes, func(pre string) bool { return pre == "" || strings.HasPrefix(p, pre+"/") }) {
				if err := w.expand(ino); err != nil {
					return err
				}
				break
			}
		}
	}
	return nil
}

func (w *walker) prevLinks() (linkIndex, error) {
	if w.links == nil {
		w.links = linkIndex{}
		if w.meta != "" {
			l, err := w.meta.readLinks()
			if err != nil {
				return nil, fmt.Errorf("%w: %v", errStale, err)
			}
			w.links = l
		}
	}
	return w.links, nil
}

// finish collects what changed in the records.
func (w *walker) finish(r dirResult) (*walkResult, error) {
	res := &walkResult{root: r.id, key: r.key, recs: w.p.recs, changed: w.changed}
	var drop func(k recKey) error
	drop = func(k recKey) error {
		if w.p.alive[k] || slices.Contains(res.drop, k) {
			return nil
		}
		res.drop = append(res.drop, k)
		old, err := w.record(k)
		if err != nil || old == nil {
			return err
		}
		for _, kd := range old.Kids {
			if err := drop(recKey{kd.Ino, kd.Gen}); err != nil {
				return err
			}
		}
		return nil
	}
	for k := range w.p.gone {
		if err := drop(k); err != nil {
			return nil, err
		}
	}
	links, err := w.prevLinks()
	if err != nil {
		return nil, err
	}
	res.links = linkIndex{}
	for ino, ps := range links {
		res.links[ino] = ps
	}
	for ino := range w.p.multi {
		old, had := res.links[ino]
		if ps := w.p.emitted[ino]; len(ps) > 1 {
			res.links[ino] = ps
			res.linksDirt = res.linksDirt || !slices.Equal(old, ps)
		} else if had {
			delete(res.links, ino)
			res.linksDirt = true
		}
	}
	return res, nil
}
