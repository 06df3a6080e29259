package history

import (
	"bytes"
	"context"
	"slices"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
)

// LineageOptions configures Lineage. It has no fields yet; it is a struct
// so the daemon's route and later filters need no new signature.
type LineageOptions struct{}

// LineageSandbox is one live sandbox of the home in a Lineage.
type LineageSandbox struct {
	Name string   `json:"name"`
	Head delta.ID `json:"head"`
	// Origin is the checkpoint the sandbox was branched from (zero when it
	// was created from a base), and OriginSandbox the sandbox that took it.
	Origin        delta.ID `json:"origin"`
	OriginSandbox string   `json:"origin_sandbox,omitempty"`
}

// LineageEntry is one checkpoint of the home with the sandboxes that meet
// it.
type LineageEntry struct {
	ID      delta.ID    `json:"id"`
	Parent  delta.ID    `json:"parent"`
	Sandbox string      `json:"sandbox"` // the label of the sandbox that took it on this home
	Removed bool        `json:"removed,omitempty"`
	Turn    int         `json:"turn"`
	Class   delta.Class `json:"class"`
	Message string      `json:"message,omitempty"`
	Created time.Time   `json:"created"`
	// BytesNew is what the checkpoint stored (delta.Stats.BytesNew).
	BytesNew int64 `json:"bytes_new"`
	// Heads are the sandboxes whose head it is.
	Heads []string `json:"heads,omitempty"`
	// Branches are the other sandboxes that continue from it: branched from
	// it, rolled back to it, or with a checkpoint whose parent it is.
	Branches []string `json:"branches,omitempty"`
}

// Lineage is the whole home's history: every sandbox and every checkpoint
// the catalog holds, children always before their parents.
type Lineage struct {
	Sandboxes   []LineageSandbox `json:"sandboxes"`
	Checkpoints []LineageEntry   `json:"checkpoints"`
}

// Lineage returns every checkpoint of the home, with where sandboxes branch
// off each other. Order: newest first, except that a checkpoint always
// comes after every child it has in the list (so a host's clock running
// behind another's never prints a parent above its child); ties by ID.
func (v *Views) Lineage(ctx context.Context, _ LineageOptions) (*Lineage, error) {
	defer v.d.Shared()()
	out := &Lineage{Sandboxes: []LineageSandbox{}, Checkpoints: []LineageEntry{}}
	err := v.d.View(ctx, func(tx *catalog.Tx) error {
		g, err := loadGraph(tx)
		if err != nil {
			return err
		}
		for _, sb := range g.sandboxes {
			ls := LineageSandbox{Name: string(sb.Name), Head: g.heads[string(sb.Name)], Origin: sb.Origin}
			if cp := g.byID[sb.Origin]; cp != nil {
				ls.OriginSandbox = g.label(cp)
			}
			out.Sandboxes = append(out.Sandboxes, ls)
		}
		for _, cp := range g.ordered() {
			out.Checkpoints = append(out.Checkpoints, LineageEntry{
				ID: cp.ID, Parent: cp.Parent, Sandbox: g.label(cp), Removed: !g.live[string(cp.SandboxKey())],
				Turn: cp.Turn, Class: cp.Class, Message: cp.Message, Created: cp.Created,
				BytesNew: cp.Stats.BytesNew, Heads: g.headsAt[cp.ID], Branches: g.branchesAt(cp),
			})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// branchMarks fills each entry's Branches: the other sandboxes that
// continue from it. Log calls it inside its transaction; it reads the
// children index of each entry, not the whole home.
func branchMarks(tx *catalog.Tx, entries []LogEntry) error {
	sbs, err := tx.Sandboxes()
	if err != nil {
		return err
	}
	names := map[string]string{}
	at := map[delta.ID][]*delta.Sandbox{} // checkpoint -> sandboxes whose origin or head it is
	for _, sb := range sbs {
		names[string(sb.Key())] = string(sb.Name)
		at[sb.Origin] = append(at[sb.Origin], sb)
		if h, err := tx.GetRef(delta.RefHead, string(sb.Name)); err == nil && h != sb.Origin {
			at[h] = append(at[h], sb)
		}
	}
	label := func(cp *delta.Checkpoint) string {
		if n, ok := names[string(cp.SandboxKey())]; ok {
			return n
		}
		return string(cp.Sandbox)
	}
	for i := range entries {
		cp := entries[i].Checkpoint
		var out []string
		add := func(l string) {
			if l != label(cp) && !slices.Contains(out, l) {
				out = append(out, l)
			}
		}
		for _, sb := range at[cp.ID] {
			if sb.Key() != cp.SandboxKey() {
				add(string(sb.Name))
			}
		}
		children, err := tx.Children(cp.ID)
		if err != nil {
			return err
		}
		for _, id := range children {
			if child, err := tx.Checkpoint(id); err == nil && child.SandboxKey() != cp.SandboxKey() {
				add(label(child))
			}
		}
		slices.Sort(out)
		entries[i].Branches = out
	}
	return nil
}

// graph is the home's checkpoints and sandboxes, indexed for Lineage.
type graph struct {
	sandboxes []*delta.Sandbox
	byID      map[delta.ID]*delta.Checkpoint
	names     map[string]string     // sandbox key -> live label
	live      map[string]bool       // sandbox keys with a live sandbox
	heads     map[string]delta.ID   // live label -> head
	headsAt   map[delta.ID][]string // checkpoint -> labels whose head it is
	children  map[delta.ID][]delta.ID
	// meets lists, per checkpoint, the labels of sandboxes whose line
	// passes through it from outside: their origin or head is it, or one
	// of their checkpoints has it as parent.
	meets map[delta.ID][]string
}

func loadGraph(tx *catalog.Tx) (*graph, error) {
	g := &graph{byID: map[delta.ID]*delta.Checkpoint{}, names: map[string]string{}, live: map[string]bool{},
		heads: map[string]delta.ID{}, headsAt: map[delta.ID][]string{}, children: map[delta.ID][]delta.ID{},
		meets: map[delta.ID][]string{}}
	sbs, err := tx.Sandboxes()
	if err != nil {
		return nil, err
	}
	g.sandboxes = sbs
	for _, sb := range sbs {
		g.names[string(sb.Key())], g.live[string(sb.Key())] = string(sb.Name), true
	}
	heads, err := tx.Refs(delta.RefHead)
	if err != nil {
		return nil, err
	}
	for _, r := range heads {
		if _, err := tx.Sandbox(delta.SandboxName(r.Name)); err != nil {
			continue // a head with no live sandbox names nothing to draw
		}
		g.heads[r.Name] = r.Target
		g.headsAt[r.Target] = append(g.headsAt[r.Target], r.Name)
	}
	err = tx.ForEachCheckpoint(func(cp *delta.Checkpoint) error {
		g.byID[cp.ID] = cp
		return nil
	})
	if err != nil {
		return nil, err
	}
	add := func(at delta.ID, label string) {
		if !slices.Contains(g.meets[at], label) {
			g.meets[at] = append(g.meets[at], label)
		}
	}
	for _, cp := range g.byID {
		if p := g.byID[cp.Parent]; p != nil {
			g.children[p.ID] = append(g.children[p.ID], cp.ID)
			if p.SandboxKey() != cp.SandboxKey() {
				add(p.ID, g.label(cp))
			}
		}
	}
	for _, sb := range sbs {
		for _, at := range []delta.ID{sb.Origin, g.heads[string(sb.Name)]} {
			if cp := g.byID[at]; cp != nil && cp.SandboxKey() != sb.Key() {
				add(at, string(sb.Name))
			}
		}
	}
	for _, l := range g.meets {
		slices.Sort(l)
	}
	for _, l := range g.headsAt {
		slices.Sort(l)
	}
	return g, nil
}

// label is the name a checkpoint's sandbox goes by on this home: the live
// sandbox's, else the one in the record.
func (g *graph) label(cp *delta.Checkpoint) string {
	if n, ok := g.names[string(cp.SandboxKey())]; ok {
		return n
	}
	return string(cp.Sandbox)
}

func (g *graph) branchesAt(cp *delta.Checkpoint) []string {
	var out []string
	for _, l := range g.meets[cp.ID] {
		if l != g.label(cp) {
			out = append(out, l)
		}
	}
	return out
}

// ordered returns every checkpoint, children before parents, otherwise
// newest first: repeatedly take the newest checkpoint none of whose
// children is still waiting (Kahn's algorithm on the reversed edges).
func (g *graph) ordered() []*delta.Checkpoint {
	waiting := map[delta.ID]int{} // children not yet output
	for id, ch := range g.children {
		waiting[id] = len(ch)
	}
	newer := func(a, b *delta.Checkpoint) int {
		if c := b.Created.Compare(a.Created); c != 0 {
			return c
		}
		return bytes.Compare(a.ID[:], b.ID[:])
	}
	var ready []*delta.Checkpoint
	for _, cp := range g.byID {
		if waiting[cp.ID] == 0 {
			ready = append(ready, cp)
		}
	}
	out := make([]*delta.Checkpoint, 0, len(g.byID))
	for len(ready) > 0 {
		// A sorted slice is plenty: homes hold thousands of checkpoints,
		// and each step moves at most one parent into it.
		slices.SortFunc(ready, newer)
		cp := ready[0]
		ready = ready[1:]
		out = append(out, cp)
		if p := g.byID[cp.Parent]; p != nil {
			if waiting[p.ID]--; waiting[p.ID] == 0 {
				ready = append(ready, p)
			}
		}
	}
	return out
}
