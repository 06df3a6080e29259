package controller

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// choose picks the node for one sandbox among the live nodes that match
// the selector and have room: want, if given, or else the least loaded,
// nodes that hold the sandbox's data (holds[name] > 0, higher first)
// winning ties, then by name. avoid is never chosen (a dead node). nil and
// the reason when none fits.
func choose(all []node, now time.Time, want string, sel map[string]string, load map[string]int, capacity int,
	holds map[string]int, avoid string) (*node, string) {
	var cands []node
	var why []string
	for _, n := range all {
		switch {
		case n.Name == avoid:
		case want != "" && n.Name != want:
		case !n.live(now):
			why = append(why, n.Name+": lease expired")
		case !n.matches(sel):
			why = append(why, n.Name+": node selector")
		case capacity > 0 && load[n.Name] >= capacity:
			why = append(why, fmt.Sprintf("%s: full (%d sandboxes)", n.Name, load[n.Name]))
		default:
			cands = append(cands, n)
		}
	}
	if len(cands) == 0 {
		if want != "" && len(why) == 0 {
			return nil, "node " + want + " has no live node agent"
		}
		if len(why) == 0 {
			return nil, "no node agent has a lease"
		}
		return nil, "no node fits: " + strings.Join(why, "; ")
	}
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if load[a.Name] != load[b.Name] {
			return load[a.Name] < load[b.Name]
		}
		if holds[a.Name] != holds[b.Name] {
			return holds[a.Name] > holds[b.Name]
		}
		return a.Name < b.Name
	})
	return &cands[0], ""
}
